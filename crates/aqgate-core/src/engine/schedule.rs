//! Schedules of messages sent to a remote queue space, the TEDG's forms: when a message may
//! be dequeued at the remote. A client gives one in the `AQ-Schedule` HTTP header; it
//! applies to every message of the request, which is stored here with that delay (and
//! the forwarding job carries what remains of it to the remote).
//!
//! - `HH:MM`: the next time the server's clock shows HH:MM in its time zone
//!   ([`Clock::utc_offset`](crate::clock::Clock::utc_offset)); if that has passed today,
//!   tomorrow (the TEDG: "scheduled at schedule_time plus 1 day"). A time the clock skips
//!   (daylight saving begins) is the next day's; one it shows twice, the next of the two.
//! - `L:HH:MM`: the same in the client's time zone, a fixed UTC offset given in the
//!   `AQ-Client-Timezone` header (`+01:00`, `-0530`, `Z`).
//! - `R:HH:MM`: hours and minutes from now. Relative, like an IDAP `delay`: at most the
//!   space's `max_delay`.
//! - An RFC 3339 timestamp with its offset (`2026-05-01T08:00:00Z`, `…T10:00:00+02:00`):
//!   that moment; one that has passed means now.

use crate::clock::{MICROS_PER_SEC, Micros};

const DAY: i64 = 86_400;

/// The schedule headers of a request, as the client gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSchedule {
    /// `AQ-Schedule`.
    pub value: String,
    /// `AQ-Client-Timezone`.
    pub timezone: Option<String>,
}

/// A parsed schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// A wall-clock time (minutes after midnight) in the server's time zone (`offset`
    /// `None`) or at a fixed offset from UTC, in seconds.
    Wall { minutes: i64, offset: Option<i64> },
    /// Seconds from now.
    Relative(i64),
    /// A moment.
    At(Micros),
}

impl Schedule {
    /// Parses the headers; the error says what is wrong, for a Fault.
    pub fn parse(s: &ClientSchedule) -> Result<Self, String> {
        let v = s.value.trim();
        let zone = || -> Result<i64, String> {
            let tz = s.timezone.as_deref().ok_or_else(|| {
                format!("AQ-Schedule {v}: an L: schedule needs the AQ-Client-Timezone header (e.g. +01:00)")
            })?;
            parse_offset(tz.trim())
                .ok_or_else(|| format!("AQ-Client-Timezone {tz}: expected a UTC offset such as +01:00, -0530 or Z"))
        };
        if let Some(rest) = v.strip_prefix("R:").or_else(|| v.strip_prefix("r:")) {
            let (h, m) = hours_minutes(rest, 999)
                .ok_or_else(|| format!("AQ-Schedule {v}: expected R:HH:MM (hours, then minutes 00 to 59)"))?;
            return Ok(Schedule::Relative(h * 3600 + m * 60));
        }
        if let Some(rest) = v.strip_prefix("L:").or_else(|| v.strip_prefix("l:")) {
            let (h, m) =
                hours_minutes(rest, 23).ok_or_else(|| format!("AQ-Schedule {v}: expected L:HH:MM (00:00 to 23:59)"))?;
            return Ok(Schedule::Wall { minutes: h * 60 + m, offset: Some(zone()?) });
        }
        if let Some((h, m)) = hours_minutes(v, 23) {
            return Ok(Schedule::Wall { minutes: h * 60 + m, offset: None });
        }
        match chrono::DateTime::parse_from_rfc3339(v) {
            Ok(t) => Ok(Schedule::At(t.timestamp_micros())),
            Err(e) => Err(format!(
                "AQ-Schedule {v}: expected HH:MM, R:HH:MM, L:HH:MM or an RFC 3339 timestamp with its offset ({e})"
            )),
        }
    }

    /// Whether the schedule counts from now (and so is bounded by the space's `max_delay`).
    pub fn is_relative(&self) -> bool {
        matches!(self, Schedule::Relative(_))
    }

    /// The delay in whole seconds from `now` (rounded up: never ready before its time).
    /// `server_offset(t)` is the server's UTC offset in seconds at `t`.
    pub fn delay(&self, now: Micros, server_offset: &dyn Fn(Micros) -> i64) -> i64 {
        let at = match *self {
            Schedule::Relative(secs) => return secs,
            Schedule::At(t) => t,
            Schedule::Wall { minutes, offset } => {
                let now_s = now.div_euclid(MICROS_PER_SEC);
                let zone = |t: i64| offset.unwrap_or_else(|| server_offset(t.saturating_mul(MICROS_PER_SEC)));
                let local = now_s.saturating_add(zone(now_s));
                let today = local - local.rem_euclid(DAY) + minutes * 60;
                // The first moment after now whose local time is that wall time. Around a
                // daylight-saving change a wall time happens twice (the clock goes back) or
                // not at all (it goes forward: then it is the next day's); the offsets on
                // either side of one are those a day and a half before and after.
                let at = (-1..=2)
                    .map(|d| today + d * DAY)
                    .flat_map(|wall| {
                        [zone(wall - DAY - DAY / 2), zone(wall + DAY + DAY / 2)]
                            .map(|o| wall - o)
                            .into_iter()
                            .filter(move |t| t.saturating_add(zone(*t)) == wall)
                    })
                    .filter(|t| *t > now_s)
                    .min()
                    .unwrap_or(now_s + DAY);
                at * MICROS_PER_SEC
            }
        };
        (at.saturating_sub(now).max(0).saturating_add(MICROS_PER_SEC - 1)) / MICROS_PER_SEC
    }
}

/// `H:MM` or `HH:MM` (hours up to `max_hours`, with up to three digits), minutes 00–59.
fn hours_minutes(s: &str, max_hours: i64) -> Option<(i64, i64)> {
    let (h, m) = s.split_once(':')?;
    if h.is_empty() || h.len() > 3 || m.len() != 2 || !(h.bytes().chain(m.bytes())).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
    (h <= max_hours && m < 60).then_some((h, m))
}

/// `Z`, `UTC`, `+HH:MM`, `-HH:MM`, `+HHMM`, `+HH`: seconds east of UTC.
fn parse_offset(s: &str) -> Option<i64> {
    if s.eq_ignore_ascii_case("z") || s.eq_ignore_ascii_case("utc") {
        return Some(0);
    }
    let sign = match s.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits: String = s[1..].chars().filter(|c| *c != ':').collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) || !matches!(digits.len(), 2 | 4) || s[1..].matches(':').count() > 1
    {
        return None;
    }
    let h: i64 = digits[..2].parse().ok()?;
    let m: i64 = if digits.len() == 4 { digits[2..].parse().ok()? } else { 0 };
    (h <= 14 && m < 60).then_some(sign * (h * 3600 + m * 60))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &str, tz: Option<&str>) -> Result<Schedule, String> {
        Schedule::parse(&ClientSchedule { value: v.into(), timezone: tz.map(String::from) })
    }

    /// 2026-03-01T10:30:00Z.
    const NOW: Micros = 1_772_361_000 * MICROS_PER_SEC;

    #[test]
    fn the_forms_parse() {
        assert_eq!(parse("R:01:30", None), Ok(Schedule::Relative(5400)));
        assert_eq!(parse("r:30:00", None), Ok(Schedule::Relative(108_000)));
        assert_eq!(parse("08:05", None), Ok(Schedule::Wall { minutes: 485, offset: None }));
        assert_eq!(parse("L:23:59", Some("+01:00")), Ok(Schedule::Wall { minutes: 1439, offset: Some(3600) }));
        assert_eq!(parse("L:00:00", Some("-0530")), Ok(Schedule::Wall { minutes: 0, offset: Some(-19_800) }));
        assert_eq!(parse("2026-03-01T12:00:00+01:00", None), Ok(Schedule::At(NOW + 3600 * MICROS_PER_SEC / 2)));
        for bad in ["", "24:00", "10:60", "1:2", "R:", "R:1:5", "R:-1:00", "L:25:00", "tomorrow", "2026-03-01T12:00:00"]
        {
            assert!(parse(bad, Some("Z")).is_err(), "{bad}");
        }
        assert!(parse("L:10:00", None).expect_err("no zone").contains("AQ-Client-Timezone"));
        for bad in ["+1:00", "01:00", "+15:00", "+01:60", "+01:00:00", "CET"] {
            assert!(parse("L:10:00", Some(bad)).expect_err("a bad zone").contains("AQ-Client-Timezone"), "{bad}");
        }
    }

    #[test]
    fn wall_times_are_the_next_occurrence() {
        let utc = |_| 0;
        let plus2 = |_| 7200;
        let d = |v: &str, tz: Option<&str>, off: &dyn Fn(Micros) -> i64| parse(v, tz).map(|s| s.delay(NOW, off));
        assert_eq!(d("11:30", None, &utc), Ok(3600));
        assert_eq!(d("09:30", None, &utc), Ok(23 * 3600), "passed today: tomorrow");
        assert_eq!(d("10:30", None, &utc), Ok(DAY), "now has passed too");
        assert_eq!(d("13:30", None, &plus2), Ok(3600), "the server's zone");
        assert_eq!(d("L:13:30", Some("+02:00"), &utc), Ok(3600), "the client's zone");
        assert_eq!(d("L:05:30", Some("-05:00"), &utc), Ok(DAY), "10:30 UTC is 05:30 at -05:00");
        assert_eq!(d("R:00:01", None, &utc), Ok(60));
        assert_eq!(d("2026-03-01T10:00:00Z", None, &utc), Ok(0), "a past moment is now");
        assert_eq!(parse("2026-03-01T10:30:00.5Z", None).map(|s| s.delay(NOW, &utc)), Ok(1), "rounded up");
        // A daylight-saving change between now and then: +1 h until noon UTC, +2 h after.
        let dst = |t: Micros| if t < NOW + 5400 * MICROS_PER_SEC { 3600 } else { 7200 };
        assert_eq!(d("15:00", None, &dst), Ok(9000), "15:00 at +02:00 is 13:00 UTC");
        // The clock goes forward at 12:00 UTC, from 13:00 to 14:00: 13:30 is not shown that
        // day (not 12:30 UTC, when the clock shows 14:30); it is the next day's 13:30.
        let forward = |t: Micros| if t < NOW + 5400 * MICROS_PER_SEC { 3600 } else { 7200 };
        assert_eq!(d("13:30", None, &forward), Ok(DAY + 3600), "a wall time the clock skips");
        assert_eq!(d("14:30", None, &forward), Ok(7200), "14:30 at +02:00 is 12:30 UTC");
        // The clock goes back at 12:00 UTC, from 14:00 to 13:00: 13:15 is shown twice, first
        // at 11:15 UTC, then at 12:15 UTC; after the first, the second is next.
        let back = |t: Micros| if t < NOW + 5400 * MICROS_PER_SEC { 7200 } else { 3600 };
        assert_eq!(d("13:15", None, &back), Ok(2700), "the first of the two");
        let later = NOW + 3600 * MICROS_PER_SEC;
        assert_eq!(parse("13:15", None).map(|s| s.delay(later, &back)), Ok(2700), "the second: 12:15 UTC");
        assert_eq!(parse("12:15", None).map(|s| s.delay(later, &back)), Ok(DAY - 15 * 60), "passed: tomorrow");
    }
}
