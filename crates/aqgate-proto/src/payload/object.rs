//! Object (ADT) payloads: checked against their declaration, attribute by attribute, into
//! the canonical element (declared names and order, NULLs omitted); NUMBER, DATE and
//! TIMESTAMP values.

use super::*;
use crate::idap::model::XmlNode;

/// Canonical element `out_name` for a value of declared type `tname`.
pub(super) fn canon_named(
    reg: &TypeRegistry,
    tname: &str,
    node: &XmlNode,
    out_name: &str,
    path: &str,
) -> Result<XmlNode, PayloadError> {
    let Some(body) = reg.types.get(tname) else {
        return Err(invalid(path, format!("type {tname} is not declared")));
    };
    let mut out = XmlNode::new(out_name);
    match body {
        Body::Object(attrs) => {
            let mut slots: Vec<Option<Option<XmlNode>>> = vec![None; attrs.len()];
            for e in child_elements(node, path)? {
                let ln = e.local_name();
                let Some(i) = attrs.iter().position(|a| a.name.eq_ignore_ascii_case(ln)) else {
                    return Err(invalid(path, format!("unknown attribute {ln}")));
                };
                let a = &attrs[i];
                let Some(slot) = slots.get_mut(i) else { continue };
                if slot.is_some() {
                    return Err(invalid(path, format!("duplicate attribute {}", a.name)));
                }
                *slot = Some(canon_value(reg, &a.ty, e, &a.name, &format!("{path}.{}", a.name))?);
            }
            for v in slots.into_iter().flatten().flatten() {
                out.push(v);
            }
        }
        Body::Varray { element, max } => {
            let item_name = format!("{out_name}_ITEM");
            for (i, e) in child_elements(node, path)?.into_iter().enumerate() {
                let n = i + 1;
                if n > *max as usize {
                    return Err(invalid(path, format!("more than {max} items (VARRAY limit of {tname})")));
                }
                let item = canon_value(reg, element, e, &item_name, &format!("{path}[{n}]"))?;
                out.push(item.unwrap_or_else(|| XmlNode::new(&item_name)));
            }
        }
    }
    Ok(out)
}

/// Canonical element for one attribute (or item) value; `None` for NULL.
pub(super) fn canon_value(
    reg: &TypeRegistry,
    ty: &Ty,
    e: &XmlNode,
    out_name: &str,
    path: &str,
) -> Result<Option<XmlNode>, PayloadError> {
    match &ty.kind {
        AttrType::Named(t) => canon_named(reg, t, e, out_name, path).map(Some),
        AttrType::Xml => {
            if e.elements().next().is_none() && e.text().trim().is_empty() {
                return Ok(None);
            }
            let inner = normalize_xml(e, 0)?;
            Ok(Some(XmlNode { name: out_name.to_string(), attrs: Vec::new(), children: inner.children }))
        }
        _ => {
            let text = leaf_text(e, path)?;
            Ok(canon_scalar(ty, &text, path)?.map(|v| leaf(out_name, v)))
        }
    }
}

/// Checks a scalar value; returns its canonical text, `None` for NULL.
pub(super) fn canon_scalar(ty: &Ty, text: &str, path: &str) -> Result<Option<String>, PayloadError> {
    let t = text.trim();
    match &ty.kind {
        AttrType::Number { precision, scale } => {
            if t.is_empty() {
                return Ok(None);
            }
            let Some(mut d) = Decimal::parse(t) else {
                return Err(invalid(path, format!("value {} is not a NUMBER", quote(t))));
            };
            if d.msd().is_some_and(|m| m > NUMBER_MAX_EXP) {
                return Err(invalid(path, format!("value {} is out of range for NUMBER", quote(t))));
            }
            let changed = match scale {
                Some(s) => d.round_to_scale(*s),
                None => false,
            };
            if let (Some(s), Some(m)) = (scale, d.msd()) {
                let p = i64::from(precision.unwrap_or(38));
                if m >= p - s {
                    let hint = if p - s > 0 {
                        format!("at most {} digits before the decimal point", p - s)
                    } else {
                        format!("absolute value below 1E{}", p - s)
                    };
                    return Err(invalid(path, format!("value {} is too large for {} ({hint})", quote(t), ty.decl)));
                }
            }
            Ok(Some(if changed { d.to_plain() } else { t.to_string() }))
        }
        AttrType::Text { max, bytes } => {
            if text.is_empty() {
                return Ok(None);
            }
            let (len, unit) = if *bytes { (text.len(), "bytes") } else { (text.chars().count(), "characters") };
            if len > *max {
                return Err(invalid(path, format!("value of {len} {unit} is too long for {}", ty.decl)));
            }
            Ok(Some(text.to_string()))
        }
        AttrType::Date | AttrType::Timestamp { .. } => {
            if t.is_empty() {
                return Ok(None);
            }
            let frac_max = match ty.kind {
                AttrType::Timestamp { frac } => frac,
                _ => 0,
            };
            match DateTime::parse(t) {
                Some(dt) if dt.frac.trim_end_matches('0').len() <= frac_max => Ok(Some(t.to_string())),
                Some(_) => Err(invalid(
                    path,
                    format!("value {} has more fractional-second digits than {} allows", quote(t), ty.decl),
                )),
                None => {
                    Err(invalid(path, format!("value {} is not a valid {} (YYYY-MM-DD[ HH:MI:SS])", quote(t), ty.decl)))
                }
            }
        }
        AttrType::Raw { max } => {
            let bytes = parse_hex(text).map_err(|m| invalid(path, m))?;
            if bytes.is_empty() {
                return Ok(None);
            }
            if let Some(m) = max
                && bytes.len() > *m
            {
                return Err(invalid(path, format!("value of {} bytes is too long for {}", bytes.len(), ty.decl)));
            }
            Ok(Some(hex_upper(&bytes)))
        }
        AttrType::Clob => Ok(if text.is_empty() { None } else { Some(text.to_string()) }),
        AttrType::Xml | AttrType::Named(_) => Err(invalid(path, "not a scalar type")),
    }
}

/// A decimal number: `digits × 10^exp`, no leading or trailing zero digits; zero has no digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Decimal {
    pub(super) neg: bool,
    pub(super) digits: Vec<u8>,
    pub(super) exp: i64,
}

impl Decimal {
    /// `[+-]digits[.digits][E[+-]digits]` (at least one mantissa digit).
    pub(super) fn parse(t: &str) -> Option<Self> {
        let b = t.as_bytes();
        let mut i = 0;
        let neg = match b.first() {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let mut digits = Vec::new();
        let mut frac_len: i64 = 0;
        let mut seen_point = false;
        while let Some(&c) = b.get(i) {
            match c {
                b'0'..=b'9' => {
                    digits.push(c - b'0');
                    if seen_point {
                        frac_len += 1;
                    }
                }
                b'.' if !seen_point => seen_point = true,
                _ => break,
            }
            i += 1;
        }
        if digits.is_empty() {
            return None;
        }
        let mut e: i64 = 0;
        if matches!(b.get(i), Some(b'e' | b'E')) {
            let rest = t.get(i + 1..)?;
            let body = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if body.is_empty() || body.len() > 4 || !body.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            e = rest.parse().ok()?;
            i = b.len();
        }
        if i != b.len() {
            return None;
        }
        let mut d = Decimal { neg, digits, exp: e - frac_len };
        d.normalize();
        Some(d)
    }

    pub(super) fn normalize(&mut self) {
        let lead = self.digits.iter().take_while(|d| **d == 0).count();
        self.digits.drain(..lead);
        while self.digits.last() == Some(&0) {
            self.digits.pop();
            self.exp += 1;
        }
        if self.digits.is_empty() {
            self.neg = false;
            self.exp = 0;
        }
    }

    /// Power of ten of the most significant digit; None for zero.
    pub(super) fn msd(&self) -> Option<i64> {
        if self.digits.is_empty() { None } else { Some(self.digits.len() as i64 - 1 + self.exp) }
    }

    /// Rounds half away from zero to `scale` fraction digits; whether the value changed.
    pub(super) fn round_to_scale(&mut self, scale: i64) -> bool {
        let min_exp = -scale;
        if self.digits.is_empty() || self.exp >= min_exp {
            return false;
        }
        let drop = usize::try_from(min_exp - self.exp).unwrap_or(usize::MAX);
        let len = self.digits.len();
        if drop > len {
            self.digits.clear();
            self.normalize();
            return true;
        }
        let round_up = self.digits.get(len - drop).is_some_and(|d| *d >= 5);
        self.digits.truncate(len - drop);
        self.exp = min_exp;
        if round_up {
            let mut carry = true;
            for d in self.digits.iter_mut().rev() {
                if *d == 9 {
                    *d = 0;
                } else {
                    *d += 1;
                    carry = false;
                    break;
                }
            }
            if carry {
                self.digits.insert(0, 1);
            }
        }
        self.normalize();
        true
    }

    /// Plain decimal text (no exponent, no trailing fraction zeros).
    pub(super) fn to_plain(&self) -> String {
        if self.digits.is_empty() {
            return "0".into();
        }
        let ds: String = self.digits.iter().map(|d| char::from(b'0' + d)).collect();
        let mut s = String::from(if self.neg { "-" } else { "" });
        if self.exp >= 0 {
            s.push_str(&ds);
            s.extend(std::iter::repeat_n('0', usize::try_from(self.exp).unwrap_or(0)));
        } else {
            let frac = usize::try_from(-self.exp).unwrap_or(0);
            if frac >= ds.len() {
                s.push_str("0.");
                s.extend(std::iter::repeat_n('0', frac - ds.len()));
                s.push_str(&ds);
            } else {
                let (int, fr) = ds.split_at(ds.len() - frac);
                s.push_str(int);
                s.push('.');
                s.push_str(fr);
            }
        }
        s
    }

    pub(super) fn to_f64(&self) -> f64 {
        if self.digits.is_empty() {
            return 0.0;
        }
        let ds: String = self.digits.iter().map(|d| char::from(b'0' + d)).collect();
        let sign = if self.neg { "-" } else { "" };
        format!("{sign}{ds}e{}", self.exp).parse().unwrap_or(f64::NAN)
    }
}

/// A DATE / TIMESTAMP value, checked against the calendar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DateTime {
    pub(super) y: u32,
    pub(super) mo: u32,
    pub(super) d: u32,
    pub(super) h: u32,
    pub(super) mi: u32,
    pub(super) s: u32,
    /// Fractional-second digits as written (may be empty).
    pub(super) frac: String,
}

impl DateTime {
    /// `YYYY-MM-DD`, `YYYY-MM-DD H:M:S[.f]` or `YYYY-MM-DDTH:M:S[.f]` (1-2 digit parts, 4-digit year).
    pub(super) fn parse(t: &str) -> Option<Self> {
        fn num(s: &str, min_len: usize, max_len: usize) -> Option<u32> {
            (s.len() >= min_len && s.len() <= max_len && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        }
        let (date, time) = match t.split_once([' ', 'T']) {
            Some((d, tm)) => (d, Some(tm.trim_start())),
            None => (t, None),
        };
        let mut dp = date.split('-');
        let y = num(dp.next()?, 4, 4)?;
        let mo = num(dp.next()?, 1, 2)?;
        let d = num(dp.next()?, 1, 2)?;
        if dp.next().is_some() {
            return None;
        }
        let (mut h, mut mi, mut s, mut frac) = (0, 0, 0, String::new());
        if let Some(tm) = time {
            let mut tp = tm.split(':');
            h = num(tp.next()?, 1, 2)?;
            mi = num(tp.next()?, 1, 2)?;
            let sec = tp.next()?;
            if tp.next().is_some() {
                return None;
            }
            let (whole, f) = match sec.split_once('.') {
                Some((w, f)) => (w, Some(f)),
                None => (sec, None),
            };
            s = num(whole, 1, 2)?;
            if let Some(f) = f {
                if f.is_empty() || f.len() > 9 || !f.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                frac = f.to_string();
            }
        }
        let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
        let days = match mo {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            2 if leap => 29,
            2 => 28,
            _ => return None,
        };
        (y >= 1 && (1..=days).contains(&d) && h < 24 && mi < 60 && s < 60).then_some(DateTime {
            y,
            mo,
            d,
            h,
            mi,
            s,
            frac,
        })
    }

    /// `YYYY-MM-DD HH:MM:SS[.f]`, which compares correctly as text.
    pub(super) fn normalized(&self) -> String {
        let DateTime { y, mo, d, h, mi, s, .. } = self;
        let f = self.frac.trim_end_matches('0');
        let dot = if f.is_empty() { "" } else { "." };
        format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}{dot}{f}")
    }
}
