//! A propagation job's schedule (DBMS_AQADM.SCHEDULE_PROPAGATION's start time, duration,
//! next time and latency): the windows in which the job propagates, and how long a message
//! may wait in one before it is moved.
//!
//! Windows open at `start`, then every `next` seconds after the previous one opened; each
//! lasts `duration` seconds. Without `duration` the first window never closes; without
//! `next` there is no window after the first. Without a schedule (or with only `latency`)
//! the job propagates at all times.
//!
//! `latency` 0 (the default) is event-driven: the job's receive waits for the commit that
//! makes a message visible. With `latency` > 0 the job looks for messages, moves what it
//! finds, and when that was less than a full batch it waits `latency` seconds (holding no
//! receive open) before it looks again, so messages gather into fuller batches and none
//! waits much longer than `latency` once it is ready.

use serde::{Deserialize, Serialize};

use crate::clock::{MICROS_PER_SEC, Micros};

/// The largest `latency`, `duration` and `next` accepted, in seconds (a year).
const MAX_SECONDS: u64 = 366 * 86_400;

/// `schedule = { start = "…", duration = …, next = …, latency = … }` on a job, as the
/// topology file gives it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ScheduleDef {
    /// When the first window opens: an RFC 3339 timestamp (`2026-05-01T22:00:00Z`,
    /// `2026-05-01T22:00:00+02:00`). Needed with `duration` or `next`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    /// How long each window lasts, in seconds (none: the window never closes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<u64>,
    /// Seconds from the opening of a window to the opening of the next one (none: no
    /// window after the first). At least `duration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<u64>,
    /// How long, in seconds, a ready message may wait before the job moves it (0:
    /// immediately, event-driven).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<u64>,
}

/// A resolved schedule, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Schedule {
    /// The first window's opening (none: windows are not restricted).
    pub start: Option<Micros>,
    pub duration: Option<Micros>,
    pub next: Option<Micros>,
    /// Seconds.
    pub latency: u64,
}

/// Where `now` is with respect to the windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Inside a window that closes at `until` (none: never).
    Open { until: Option<Micros> },
    /// Outside: the next window opens at `next` (none: no window any more).
    Closed { next: Option<Micros> },
}

impl Schedule {
    /// The window `now` falls in, or when the next one opens.
    pub fn window(&self, now: Micros) -> Window {
        let Some(start) = self.start else { return Window::Open { until: None } };
        if now < start {
            return Window::Closed { next: Some(start) };
        }
        let Some(duration) = self.duration else { return Window::Open { until: None } };
        let opened = match self.next {
            Some(every) if every > 0 => start + (now - start) / every * every,
            _ => start,
        };
        if now < opened.saturating_add(duration) {
            return Window::Open { until: Some(opened.saturating_add(duration)) };
        }
        Window::Closed { next: self.next.filter(|n| *n > 0).map(|every| opened.saturating_add(every)) }
    }
}

/// Checks `def`; every problem is pushed to `errors` under `key` (`propagations[0] (x).schedule`).
pub fn resolve(def: &ScheduleDef, key: &str, errors: &mut Vec<String>) -> Schedule {
    let mut s = Schedule::default();
    let seconds = |what: &str, v: Option<u64>, min: u64, errors: &mut Vec<String>| -> Option<Micros> {
        let v = v?;
        if v < min || v > MAX_SECONDS {
            errors.push(format!("{key}.{what}: {min} to {MAX_SECONDS} seconds"));
            return None;
        }
        i64::try_from(v).ok().map(|v| v * MICROS_PER_SEC)
    };
    if let Some(t) = &def.start {
        match chrono::DateTime::parse_from_rfc3339(t.trim()) {
            Ok(d) => s.start = Some(d.timestamp_micros()),
            Err(e) => errors.push(format!("{key}.start: {t:?} is not an RFC 3339 timestamp ({e})")),
        }
    } else if def.duration.is_some() || def.next.is_some() {
        errors.push(format!("{key}.start: needed with duration or next (when the first window opens)"));
    }
    s.duration = seconds("duration", def.duration, 1, errors);
    s.next = seconds("next", def.next, 1, errors);
    match (def.duration, def.next) {
        (None, Some(_)) => errors.push(format!("{key}.next: needs duration (a window without one never closes)")),
        (Some(d), Some(n)) if n < d => {
            errors.push(format!("{key}.next: {n} is less than duration {d} (windows would overlap)"));
        }
        _ => {}
    }
    if let Some(l) = def.latency {
        if l > 86_400 {
            errors.push(format!("{key}.latency: 0 to 86400 seconds"));
        } else {
            s.latency = l;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_780_000_000 * MICROS_PER_SEC;

    fn at(secs: i64) -> Micros {
        S + secs * MICROS_PER_SEC
    }

    fn resolved(def: ScheduleDef) -> Result<Schedule, Vec<String>> {
        let mut errors = Vec::new();
        let s = resolve(&def, "propagations[0] (j).schedule", &mut errors);
        if errors.is_empty() { Ok(s) } else { Err(errors) }
    }

    fn start() -> Option<String> {
        Some("2026-05-28T20:26:40Z".into())
    }

    #[test]
    fn windows_open_at_start_last_duration_and_repeat_every_next() {
        let s =
            resolved(ScheduleDef { start: start(), duration: Some(10), next: Some(60), latency: None }).expect("valid");
        assert_eq!(s.start, Some(S), "2026-05-28T20:26:40Z");
        assert_eq!(s.window(at(-5)), Window::Closed { next: Some(at(0)) });
        assert_eq!(s.window(at(0)), Window::Open { until: Some(at(10)) });
        assert_eq!(s.window(at(9)), Window::Open { until: Some(at(10)) });
        assert_eq!(s.window(at(10)), Window::Closed { next: Some(at(60)) });
        assert_eq!(s.window(at(61)), Window::Open { until: Some(at(70)) });
        assert_eq!(s.window(at(3605)), Window::Open { until: Some(at(3610)) });
        // One window only, without next; forever, without duration.
        let once = resolved(ScheduleDef { start: start(), duration: Some(10), ..ScheduleDef::default() }).expect("ok");
        assert_eq!(once.window(at(5)), Window::Open { until: Some(at(10)) });
        assert_eq!(once.window(at(11)), Window::Closed { next: None });
        let forever = resolved(ScheduleDef { start: start(), ..ScheduleDef::default() }).expect("ok");
        assert_eq!(forever.window(at(-1)), Window::Closed { next: Some(at(0)) });
        assert_eq!(forever.window(at(1_000_000)), Window::Open { until: None });
        let none = resolved(ScheduleDef { latency: Some(3), ..ScheduleDef::default() }).expect("ok");
        assert_eq!((none.window(at(0)), none.latency), (Window::Open { until: None }, 3));
        let offset = ScheduleDef { start: Some("2026-05-28T22:26:40+02:00".into()), ..ScheduleDef::default() };
        assert_eq!(resolved(offset).expect("ok").start, Some(S));
    }

    #[test]
    fn bad_schedules_name_their_key() {
        let cases = [
            (ScheduleDef { start: Some("tomorrow".into()), ..ScheduleDef::default() }, "schedule.start: \"tomorrow\""),
            (ScheduleDef { duration: Some(5), ..ScheduleDef::default() }, "schedule.start: needed"),
            (ScheduleDef { start: start(), duration: Some(0), ..ScheduleDef::default() }, "schedule.duration: 1 to"),
            (ScheduleDef { start: start(), next: Some(60), ..ScheduleDef::default() }, "schedule.next: needs duration"),
            (
                ScheduleDef { start: start(), duration: Some(60), next: Some(30), latency: None },
                "schedule.next: 30 is less than duration 60",
            ),
            (ScheduleDef { latency: Some(100_000), ..ScheduleDef::default() }, "schedule.latency: 0 to 86400"),
        ];
        for (def, want) in cases {
            let errors = resolved(def.clone()).expect_err("invalid");
            assert!(errors.iter().any(|e| e.contains(want)), "{def:?}: {errors:?}");
            assert!(errors.iter().all(|e| e.starts_with("propagations[0] (j).schedule.")), "{errors:?}");
        }
    }
}
