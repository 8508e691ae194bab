//! The condition language: parse arbitrary text; a condition that parses is evaluated
//! against a message whose values come from the rest of the input.
//!
//! Input: the condition text, optionally followed by a NUL byte and bytes that choose
//! the values the context answers with.
#![no_main]

use aqgate_proto::selector::{Condition, ConditionContext};
use aqgate_proto::value::Value;
use libfuzzer_sys::fuzz_target;

const PROPERTIES: &[&str] = &[
    "priority",
    "corrid",
    "msgid",
    "enq_time",
    "state",
    "delay",
    "expiration",
    "retry_count",
    "sender_name",
    "sender_address",
    "sender_protocol",
    "exception_queue",
    "consumer_name",
    "q_name",
];

/// Values picked by a name's hash and the input's context bytes.
struct Ctx<'a> {
    bytes: &'a [u8],
}

impl Ctx<'_> {
    fn value(&self, name: &str) -> Value {
        let h = name.bytes().fold(17u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        if self.bytes.is_empty() {
            return Value::Null;
        }
        let i = h as usize % self.bytes.len();
        let b = self.bytes[i];
        let rest = &self.bytes[i..];
        let rest = &rest[..rest.len().min(24)];
        match b % 8 {
            0 => Value::Null,
            1 => Value::Bool(b & 0x10 != 0),
            2 => Value::Number(f64::from(b) - 128.0),
            3 => {
                let mut raw = [0u8; 8];
                for (d, s) in raw.iter_mut().zip(rest) {
                    *d = *s;
                }
                Value::Number(f64::from_le_bytes(raw))
            }
            4 => Value::Number(
                [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 1e300, 5e-324][usize::from(b >> 5) % 6],
            ),
            5 => Value::Text(String::new()),
            6 => Value::Text(String::from_utf8_lossy(rest).into_owned()),
            _ => Value::Text(format!("{}", i64::from(b) * 37 - 4000)),
        }
    }
}

impl ConditionContext for Ctx<'_> {
    fn property(&self, name: &str) -> Option<Value> {
        PROPERTIES.contains(&name).then(|| self.value(name))
    }
    fn user_data(&self, path: &[String]) -> Value {
        self.value(&format!("tab.user_data.{}", path.join(".")))
    }
    fn user_property(&self, name: &str) -> Value {
        self.value(&format!("user:{name}"))
    }
}

fuzz_target!(|data: &[u8]| {
    let (text, ctx) = match data.iter().position(|&b| b == 0) {
        Some(p) => (&data[..p], &data[p + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(text) else { return };
    let Ok(cond) = Condition::parse(text) else { return };
    let _ = cond.names();
    let _ = cond.references_user_data();
    let _ = cond.eval(&Ctx { bytes: ctx });
    let _ = cond.eval(&Ctx { bytes: &[] });
});
