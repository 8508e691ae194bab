//! A listing's filter ([`ViewFilter`]) as SQL over a message row `m` (of `messages`,
//! `processed_messages` or `buffered_messages`, which share these columns): conditions
//! whose every value is a bound parameter (`$N`, numbered from where the statement's own
//! end), never text of the statement.

use aqgate_core::store::{PAYLOAD_SEARCH_BYTES, ViewFilter};

use crate::views::Dialect;

/// A value a condition binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Bind {
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

/// A filter in SQL: `narrow`, conditions (each ` AND …`) on `m`; `hit`, whether a payload
/// search finds `m` (`1 = 1` without one); and the values they bind, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Narrowing {
    pub narrow: String,
    pub hit: String,
    pub binds: Vec<Bind>,
}

impl Narrowing {
    /// `f`'s conditions in dialect `d`, their parameters numbered from `first`.
    pub(crate) fn of(d: Dialect, f: &ViewFilter, first: usize) -> Narrowing {
        let mut n = Narrowing { narrow: String::new(), hit: "1 = 1".to_string(), binds: Vec::new() };
        let param = |n: &mut Narrowing, b: Bind| {
            n.binds.push(b);
            format!("${}", first + n.binds.len() - 1)
        };
        if let Some(p) = f.min_priority {
            let x = param(&mut n, Bind::Int(p));
            n.narrow.push_str(&format!(" AND m.priority >= {x}"));
        }
        if let Some(p) = f.max_priority {
            let x = param(&mut n, Bind::Int(p));
            n.narrow.push_str(&format!(" AND m.priority <= {x}"));
        }
        if let Some(c) = &f.correlation {
            let x = param(&mut n, Bind::Text(c.clone()));
            if f.corr_prefix {
                n.narrow.push_str(&format!(" AND substr(m.corrid, 1, length({x})) = {x}"));
            } else {
                n.narrow.push_str(&format!(" AND m.corrid = {x}"));
            }
        }
        if let Some(s) = &f.sender {
            let x = param(&mut n, Bind::Text(s.clone()));
            let name = match d {
                Dialect::Sqlite => "json_extract(m.sender, '$.name')",
                Dialect::Postgres => "(m.sender::jsonb ->> 'name')",
            };
            n.narrow.push_str(&format!(" AND (upper({name}) = upper({x}) OR upper(m.enq_user_id) = upper({x}))"));
        }
        if let Some(t) = f.enq_from {
            let x = param(&mut n, Bind::Int(t));
            n.narrow.push_str(&format!(" AND m.enq_time >= {x}"));
        }
        if let Some(t) = f.enq_before {
            let x = param(&mut n, Bind::Int(t));
            n.narrow.push_str(&format!(" AND m.enq_time < {x}"));
        }
        if let Some(r) = f.reason {
            let x = param(&mut n, Bind::Int(r));
            n.narrow.push_str(&format!(" AND m.exc_reason = {x}"));
        }
        if let Some(id) = f.msgid {
            let x = param(&mut n, Bind::Bytes(id.to_vec()));
            n.narrow.push_str(&format!(" AND m.msgid = {x}"));
        }
        if let Some(p) = &f.payload {
            let x = param(&mut n, Bind::Bytes(p.clone()));
            n.hit = match d {
                Dialect::Sqlite => format!("instr(substr(m.payload, 1, {PAYLOAD_SEARCH_BYTES}), {x}) > 0"),
                Dialect::Postgres => {
                    format!("position({x}::bytea in substring(m.payload from 1 for {PAYLOAD_SEARCH_BYTES})) > 0")
                }
            };
        }
        n
    }

    /// `narrow` and the payload search together (a buffered message's conditions).
    pub(crate) fn all(&self) -> String {
        format!("{} AND {}", self.narrow, self.hit)
    }
}

/// Binds `binds` to the query `$q`, in order.
macro_rules! bind_all {
    ($q:expr, $binds:expr) => {{
        let mut q = $q;
        for b in $binds {
            q = match b {
                $crate::narrowing::Bind::Int(i) => q.bind(*i),
                $crate::narrowing::Bind::Text(t) => q.bind(t.clone()),
                $crate::narrowing::Bind::Bytes(b) => q.bind(b.clone()),
            };
        }
        q
    }};
}
pub(crate) use bind_all;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_a_parameter() {
        let f = ViewFilter {
            correlation: Some("x' OR 1=1 --".into()),
            corr_prefix: true,
            sender: Some("\"; DROP TABLE messages".into()),
            min_priority: Some(2),
            payload: Some(b"needle'".to_vec()),
            ..ViewFilter::default()
        };
        let n = Narrowing::of(Dialect::Postgres, &f, 5);
        assert!(!n.narrow.contains("OR 1=1") && !n.narrow.contains("DROP"), "{}", n.narrow);
        assert!(n.narrow.contains("$5") && n.narrow.contains("$7") && n.hit.contains("$8"), "{n:?}");
        assert_eq!(n.binds.len(), 4);
    }
}
