//! CREATE_QUEUE's `retention_time`: how long a message removed from a queue stays in it
//! as PROCESSED (shown by the `AQ$` views and `admin messages`, dequeued by nobody) before
//! the time manager deletes it. Written in the topology as seconds or `"FOREVER"`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retention {
    /// Removed messages go at once (`retention_time = 0`, the default).
    #[default]
    None,
    /// Kept that many seconds (more than 0).
    Seconds(i64),
    /// Kept until the queue table goes.
    Forever,
}

impl Retention {
    pub fn is_none(&self) -> bool {
        *self == Retention::None
    }

    /// How long a removed message is kept, in microseconds; `Some(None)`: forever.
    pub fn micros(&self) -> Option<Option<i64>> {
        match self {
            Retention::None => None,
            Retention::Seconds(s) => Some(Some(s.saturating_mul(crate::clock::MICROS_PER_SEC))),
            Retention::Forever => Some(None),
        }
    }
}

impl Serialize for Retention {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Retention::None => s.serialize_i64(0),
            Retention::Seconds(n) => s.serialize_i64(*n),
            Retention::Forever => s.serialize_str("FOREVER"),
        }
    }
}

impl<'de> Deserialize<'de> for Retention {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Retention;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("seconds (an integer >= 0) or \"FOREVER\"")
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Retention, E> {
                match n {
                    0 => Ok(Retention::None),
                    n if n > 0 => Ok(Retention::Seconds(n)),
                    _ => Err(E::custom("retention_time must be >= 0 seconds, or \"FOREVER\"")),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Retention, E> {
                let n = i64::try_from(n).map_err(|_| E::custom("retention_time is too large"))?;
                self.visit_i64(n)
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Retention, E> {
                if s.trim().eq_ignore_ascii_case("FOREVER") {
                    Ok(Retention::Forever)
                } else {
                    Err(E::custom(format!("retention_time: expected seconds or \"FOREVER\", not \"{s}\"")))
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Serialize, Debug, PartialEq)]
    struct Q {
        #[serde(default)]
        retention_time: Retention,
    }

    #[test]
    fn seconds_or_forever() {
        let q: Q = toml::from_str("retention_time = 3600").expect("ok");
        assert_eq!(q.retention_time, Retention::Seconds(3600));
        assert_eq!(q.retention_time.micros(), Some(Some(3_600_000_000)));
        let q: Q = toml::from_str("retention_time = \"forever\"").expect("ok");
        assert_eq!(q.retention_time.micros(), Some(None));
        let q: Q = toml::from_str("").expect("ok");
        assert!(q.retention_time.is_none() && q.retention_time.micros().is_none());
        assert!(toml::from_str::<Q>("retention_time = -1").expect_err("refused").to_string().contains(">= 0"));
        assert!(toml::from_str::<Q>("retention_time = \"1h\"").expect_err("refused").to_string().contains("FOREVER"));
        // The stored topology is JSON: it reads back as it was written.
        let j = serde_json::to_string(&Q { retention_time: Retention::Forever }).expect("ok");
        assert_eq!(serde_json::from_str::<Q>(&j).expect("ok").retention_time, Retention::Forever);
        let j = serde_json::to_string(&Q { retention_time: Retention::Seconds(5) }).expect("ok");
        assert_eq!(serde_json::from_str::<Q>(&j).expect("ok").retention_time, Retention::Seconds(5));
    }
}
