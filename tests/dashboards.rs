//! The Grafana dashboard (`deploy/grafana/aqgate.json`) and the Prometheus alert rules
//! (`deploy/prometheus/aqgate-alerts.yml`) against the real `/metrics`: a real `aqgate
//! serve` (with its SMTP filter and notification dispatcher) whose topology has a
//! propagation job and a Messaging Gateway link to the NATS server on this machine, so that
//! the jobs' and links' gauges are there; messages sent and propagated. Every `aqgate_…`
//! name in an expression of the dashboard or the rules must be a metric the scrape shows,
//! and both files must parse.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::gateway::tag;
use common::*;

const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/aqgate.json");
const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/aqgate-alerts.yml");

/// The `aqgate_…` identifiers in a PromQL expression.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut i = 0;
    while let Some(at) = expr[i..].find("aqgate_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && word(bytes[end]) {
            end += 1;
        }
        if start == 0 || !word(bytes[start - 1]) {
            out.insert(expr[start..end].to_string());
        }
        i = end;
    }
    out
}

/// The names of the samples in a Prometheus text exposition.
fn scraped_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Every `expr` of the dashboard's panels and the query of its variables.
fn dashboard_exprs(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("the dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(d["uid"], "aqgate", "{}", path.display());
    let mut exprs = Vec::new();
    let panels = d["panels"].as_array().expect("panels");
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap_or_else(|| panic!("a target without expr: {t}")).to_string());
        }
    }
    for v in d["templating"]["list"].as_array().expect("variables") {
        if let Some(q) = v["definition"].as_str() {
            exprs.push(q.to_string());
        }
    }
    exprs
}

/// Every rule's `expr` (and its name) in the rule file.
fn rule_exprs(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).expect("the alert rules");
    let rules: serde_norway::Value = serde_norway::from_str(&text).expect("the alert rules are YAML");
    let mut out = Vec::new();
    for g in rules["groups"].as_sequence().expect("groups") {
        for r in g["rules"].as_sequence().expect("rules") {
            let name = r["alert"].as_str().expect("every rule is an alert").to_string();
            let expr = r["expr"].as_str().unwrap_or_else(|| panic!("{name}: no expr"));
            assert!(r["labels"]["severity"].is_string() && r["annotations"]["summary"].is_string(), "{name}");
            out.push((name, expr.to_string()));
        }
    }
    out
}

#[test]
fn the_expression_reader_finds_metric_names() {
    let e = "sum by (exported_job) (rate(aqgate_a_total{x=\"aqgate\"}[5m])) + up{job=\"aqgate\"} / aqgate_b";
    assert_eq!(metric_names(e), BTreeSet::from(["aqgate_a_total".to_string(), "aqgate_b".to_string()]));
    assert_eq!(
        scraped_names("# TYPE aqgate_x gauge\naqgate_x 1\naqgate_y{job=\"J\"} 0\n"),
        BTreeSet::from(["aqgate_x".to_string(), "aqgate_y".to_string()])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_the_dashboard_and_the_alert_rules_use_is_on_metrics() {
    let t = tag();
    let extra = format!(
        r#"
[[propagations]]
name = "archive"
source = "AQUSER.RAW_INBOX"
destination = "AQUSER.RAW_ARCHIVE"

[[gateway.links]]
name = "nats"
kind = "nats"
url = "nats://127.0.0.1:4222"

[[gateway.foreign_queues]]
name = "orders"
link = "nats"
native_name = "aqgt.{t}.orders"
stream = "AQGT_{u}"
create = true

[[gateway.jobs]]
name = "to_nats"
source = "AQUSER.RAW_QUE"
destination = "orders@nats"
"#,
        u = t.to_uppercase()
    );
    let topology = demo_topology_with("dashboards", &extra);
    let db = fresh_pg_url().await;
    let (port, smtp) = (free_port(), free_port());
    let (listen, smtp_listen) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{smtp}"));
    let mut server = Proc::spawn(
        "aqgate serve (dashboards)",
        aqgate(&["serve", "--listen", &listen, "--smtp-listen", &smtp_listen, "--database", &db])
            .args(["--topology", topology.to_str().expect("utf-8")]),
    );
    server.wait_ready(port, Duration::from_secs(60));
    send_numbered(port, "AQUSER.RAW_INBOX", 0, 3, 3, "").await;
    send_numbered(port, "AQUSER.RAW_QUE", 0, 3, 3, "").await;
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 3, Duration::from_secs(30));
    wait_depth(&db, "AQUSER.RAW_QUE", 0, Duration::from_secs(30));
    let (status, text) = http_get(port, "/metrics").expect("GET /metrics");
    assert_eq!(status, 200, "{text}");
    let scraped = scraped_names(&text);
    for job in ["ARCHIVE", "TO_NATS"] {
        assert!(text.contains(&format!("aqgate_propagation_state{{job=\"{job}\",state=\"RUNNING\"}} 1")), "{text}");
    }
    assert!(text.contains("aqgate_gateway_link_connected{link=\"NATS\""), "{text}");

    let mut missing = Vec::new();
    let mut used = BTreeSet::new();
    let dashboard = dashboard_exprs(Path::new(DASHBOARD)).into_iter().map(|e| ("dashboard".to_string(), e));
    for (whose, expr) in dashboard.chain(rule_exprs(Path::new(RULES))) {
        for name in metric_names(&expr) {
            if !scraped.contains(&name) {
                missing.push(format!("{whose}: {name} in {expr}"));
            }
            used.insert(name);
        }
    }
    assert!(missing.is_empty(), "not on /metrics: {missing:#?}\n/metrics:\n{text}");
    // Not vacuous: the backlog, the job state, the links, the spool, notifications, refusals.
    for name in [
        "aqgate_propagation_backlog",
        "aqgate_propagation_lag_seconds",
        "aqgate_propagation_state",
        "aqgate_gateway_link_connected",
        "aqgate_smtp_data_spooled_total",
        "aqgate_notify_outbox_pending",
        "aqgate_http_connections_refused_total",
        "aqgate_database_writes_refused",
    ] {
        assert!(used.contains(name), "the dashboard and rules use {name}: {used:?}");
    }
}
