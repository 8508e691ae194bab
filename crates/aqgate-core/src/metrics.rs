//! The metrics registry: counters the components of one process register and bump, and
//! the servlet renders at `/metrics` (Prometheus text). Passed in, never global: two
//! engines in one process (tests) count apart, and the servlet names no component whose
//! figures it shows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A monotonically increasing count. Cheap to clone; clones count together.
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (set by its owner). Cheap to clone; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Gauge(Counter);

impl Gauge {
    pub fn set(&self, v: u64) {
        self.0.0.store(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

struct Entry {
    name: &'static str,
    help: &'static str,
    /// `counter` or `gauge`.
    kind: &'static str,
    /// `key="value"` of a labelled counter (see [`Metrics::labelled`]), else empty.
    labels: String,
    counter: Counter,
}

/// The counters of one process, in the order they were registered.
#[derive(Default)]
pub struct Metrics {
    entries: Mutex<Vec<Entry>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.entries.lock().map(|e| e.len()).unwrap_or(0);
        f.debug_struct("Metrics").field("counters", &n).finish()
    }
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The counter named `name` (Prometheus naming: `aqgate_…_total`), registered with
    /// `help` the first time; a second registration of the name gets the same counter.
    pub fn counter(&self, name: &'static str, help: &'static str) -> Counter {
        self.register(name, help, "counter", String::new())
    }

    /// The gauge named `name`, registered with `help` the first time.
    pub fn gauge(&self, name: &'static str, help: &'static str) -> Gauge {
        Gauge(self.register(name, help, "gauge", String::new()))
    }

    /// The counter `name{key="value"}` (e.g. one per propagation job): one family per
    /// name, one series per value. Quotes and backslashes in `value` are escaped.
    pub fn labelled(&self, name: &'static str, help: &'static str, key: &'static str, value: &str) -> Counter {
        let escaped = value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        self.register(name, help, "counter", format!("{key}=\"{escaped}\""))
    }

    fn register(&self, name: &'static str, help: &'static str, kind: &'static str, labels: String) -> Counter {
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(e) = entries.iter().find(|e| e.name == name && e.labels == labels) {
            return e.counter.clone();
        }
        let counter = Counter::default();
        entries.push(Entry { name, help, kind, labels, counter: counter.clone() });
        counter
    }

    /// Appends every counter to `out` in Prometheus text format, the series of a family
    /// together under one HELP and TYPE.
    pub fn render(&self, out: &mut String) {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut done: Vec<&str> = Vec::new();
        for e in entries.iter() {
            if done.contains(&e.name) {
                continue;
            }
            done.push(e.name);
            out.push_str(&format!("# HELP {0} {1}\n# TYPE {0} {2}\n", e.name, e.help, e.kind));
            for s in entries.iter().filter(|s| s.name == e.name) {
                if s.labels.is_empty() {
                    out.push_str(&format!("{} {}\n", s.name, s.counter.get()));
                } else {
                    out.push_str(&format!("{}{{{}}} {}\n", s.name, s.labels, s.counter.get()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_register_once_and_render_in_order() {
        let m = Metrics::new();
        let a = m.counter("aqgate_a_total", "A things.");
        let b = m.counter("aqgate_b_total", "B things.");
        m.counter("aqgate_a_total", "again").add(2);
        a.inc();
        b.add(5);
        let mut out = String::new();
        m.render(&mut out);
        assert_eq!(
            out,
            "# HELP aqgate_a_total A things.\n# TYPE aqgate_a_total counter\naqgate_a_total 3\n\
             # HELP aqgate_b_total B things.\n# TYPE aqgate_b_total counter\naqgate_b_total 5\n"
        );
        let l = m.labelled("aqgate_c_total", "C things.", "job", "X\"1");
        l.add(7);
        m.labelled("aqgate_c_total", "C things.", "job", "Y").inc();
        let mut out = String::new();
        m.render(&mut out);
        assert!(
            out.ends_with(
                "# HELP aqgate_c_total C things.\n# TYPE aqgate_c_total counter\naqgate_c_total{job=\"X\\\"1\"} 7\n\
                 aqgate_c_total{job=\"Y\"} 1\n"
            ),
            "{out}"
        );
        let g = m.gauge("aqgate_d", "D now.");
        g.set(4);
        g.set(3);
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.ends_with("# HELP aqgate_d D now.\n# TYPE aqgate_d gauge\naqgate_d 3\n"), "{out}");
        let other = Metrics::new();
        assert_eq!(other.counter("aqgate_a_total", "A things.").get(), 0, "registries count apart");
    }
}
