//! What one request may make the server hold, through the real binary: a message's
//! recipient list (deduplicated in linear time, capped by `--max-recipients`, refused whole
//! over the cap, quickly, while `/healthz` keeps answering), and buffered messages (counted
//! whole against the process's `--buffered-max-bytes`, the oldest spilled past it, with
//! their gauge and counters), on SQLite and PostgreSQL.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aqgate_core::error::code;
use aqgate_proto::idap::Response;
use common::*;

const TOPIC: &str = "AQUSER.EMP_TOPIC";

/// `aqgate serve` on `port` over `db`, with `extra` arguments and `env`; waits until it
/// listens.
fn serve(db: &str, port: u16, extra: &[&str], env: &[(&str, &str)]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db];
    args.extend(extra);
    let mut cmd = aqgate(&args);
    cmd.envs(env.iter().copied());
    let mut p = Proc::spawn("aqgate serve", &mut cmd);
    p.wait_port(port);
    p
}

/// An AQXmlPublish to the EMP topic, committed: one message per recipient list (each a list
/// of `<agent_name>`s), in `mode` (`""` for persistent).
fn publish(lists: &[Vec<String>], mode: &str) -> String {
    let messages: String = lists
        .iter()
        .enumerate()
        .map(|(i, names)| {
            let names: String = names.iter().map(|n| format!("<agent_name>{n}</agent_name>")).collect();
            format!(
                "<message><message_number>{}</message_number><message_header><correlation>M{}</correlation>\
                 <recipient_list>{names}</recipient_list>\
                 </message_header><message_payload><EMP_TYP><EMPNO>{}</EMPNO><ENAME>X</ENAME><JOB>Y</JOB><MGR>2</MGR>\
                 <HIREDATE>2024-01-01 0:0:0</HIREDATE><SAL>1</SAL><COMM>0</COMM><DEPTNO>10</DEPTNO></EMP_TYP>\
                 </message_payload></message>",
                i + 1,
                i + 1,
                i + 1
            )
        })
        .collect();
    let (options, commit) = match mode {
        "" => (String::new(), "<AQXmlCommit/>"),
        m => (
            format!(
                r#"<visibility>IMMEDIATE</visibility><aqgate:delivery_mode xmlns:aqgate="urn:aqgate:idap">{m}</aqgate:delivery_mode>"#
            ),
            "",
        ),
    };
    envelope(&format!(
        r#"<AQXmlPublish xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{TOPIC}</destination>{options}</producer_options><message_set><message_count>{}</message_count>{messages}</message_set>{commit}</AQXmlPublish>"#,
        lists.len()
    ))
}

fn names(n: usize, width: usize) -> Vec<String> {
    (0..n).map(|i| format!("R{i:0>w$}", w = width - 1)).collect()
}

fn fault(r: Response) -> (i32, String) {
    match r {
        Response::Fault(f) => (f.code, f.message),
        other => panic!("not a fault: {other:?}"),
    }
}

/// A REMOVE of the next message for `consumer` on the topic: its correlation, or `None`.
async fn take(port: u16, consumer: &str) -> Option<String> {
    let r = http(
        port,
        &receive(TOPIC, &format!("<consumer_name>{consumer}</consumer_name><wait_time>0</wait_time>"), COMMIT),
    )
    .await;
    match r {
        Response::Fault(f) if f.code == code::NO_MESSAGE => None,
        r => {
            let m = received(&r);
            assert_eq!(m.len(), 1, "{r:?}");
            m[0].header.correlation.clone()
        }
    }
}

/// `AQGATE_MAX_RECIPIENTS=3`: a request with one list of four is refused whole (the other
/// message of it is not enqueued either) with 24031 naming the cap, and counted; a list of
/// three that names an agent twice (in two spellings) delivers once to each.
async fn recipient_lists_are_capped_and_deduplicated(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let _serve = serve(&db, port, &[], &[("AQGATE_MAX_RECIPIENTS", "3")]);
    let three = vec!["APP1".to_string(), "app2".into(), "APP3".into()];
    let four = names(4, 4);
    let (c, m) = fault(http(port, &publish(&[three.clone(), four], "")).await);
    assert_eq!(c, code::INVALID_VALUE, "{m}");
    assert!(m.contains("message 2: recipient_list names 4 recipients") && m.contains("at most 3"), "{m}");
    assert!(m.contains("--max-recipients") && m.contains("nothing was enqueued"), "{m}");
    assert_eq!(depth(&db, TOPIC), 0, "all or nothing");
    assert_eq!(metric(port, "aqgate_recipient_list_refused_total"), 1);
    let dup = vec!["APP1".to_string(), "app1".into(), "APP2".into()];
    let r = http(port, &publish(&[dup], "")).await;
    assert!(matches!(r, Response::Publish(..)), "{r:?}");
    assert_eq!(take(port, "APP1").await.as_deref(), Some("M1"));
    assert_eq!(take(port, "APP1").await, None, "APP1 is named twice, and gets it once");
    assert_eq!(take(port, "APP2").await.as_deref(), Some("M1"));
    assert_eq!(take(port, "APP3").await, None);
    assert_eq!(metric(port, "aqgate_recipient_list_refused_total"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipient_lists_are_capped_and_deduplicated_sqlite() {
    recipient_lists_are_capped_and_deduplicated(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipient_lists_are_capped_and_deduplicated_postgres() {
    recipient_lists_are_capped_and_deduplicated(Backend::Postgres).await;
}

/// The default cap is Oracle's 1,024: a list of exactly that many is stored (each
/// recipient one delivery), and a 4 MB publish of 130,000 distinct recipients is refused
/// at once, by the parser (25443), `/healthz` answering meanwhile (it once held the server for seconds).
async fn a_huge_recipient_list_is_refused_at_once(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let _serve = serve(&db, port, &[], &[]);
    let r = http(port, &publish(&[names(1024, 7)], "")).await;
    assert!(matches!(r, Response::Publish(..)), "{r:?}");
    assert_eq!(take(port, "R001023").await.as_deref(), Some("M1"));
    let huge = publish(&[names(130_000, 7)], "");
    assert!(huge.len() > 4_000_000 && huge.len() < 4 << 20, "{}", huge.len());
    let done = Arc::new(AtomicBool::new(false));
    let poll = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                assert_eq!(http_get(port, "/healthz").map(|(s, _)| s), Some(200));
                worst = worst.max(t.elapsed());
                std::thread::sleep(Duration::from_millis(20));
            }
            worst
        })
    };
    let t = Instant::now();
    let (c, m) = fault(http(port, &huge).await);
    let took = t.elapsed();
    done.store(true, Ordering::Relaxed);
    let worst = poll.join().expect("the /healthz poller");
    // Refused while parsing, past 8,192 entries (8 per allowed recipient), before a tree
    // of 130,000 agents is built.
    assert_eq!(c, aqgate_proto::idap::CodecError::TOO_LARGE, "{m}");
    assert!(m.contains("recipient_list of over 8192 entries") && m.contains("at most 1024"), "{m}");
    assert_eq!(metric(port, "aqgate_recipient_list_refused_total"), 1, "counted with the engine's refusals");
    // Generous for a debug build on a busy machine; the quadratic check took minutes.
    assert!(took < Duration::from_secs(10), "answered in {took:?}");
    assert!(worst < Duration::from_secs(5), "/healthz waited {worst:?}");
    assert_eq!(depth(&db, TOPIC), 1, "the list of 1,024 only (1,023 recipients have still to take it)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_recipient_list_is_refused_at_once_sqlite() {
    a_huge_recipient_list_is_refused_at_once(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_recipient_list_is_refused_at_once_postgres() {
    a_huge_recipient_list_is_refused_at_once(Backend::Postgres).await;
}

/// `buffered.max_bytes` from the configuration file: buffered publishes of a one-record
/// payload and 1,000 recipients of 200 characters each count whole, so past the budget
/// the oldest are spilled; the gauge shows what is held, within the budget, and every
/// message still reaches its recipients once.
async fn buffered_memory_is_bounded_by_the_process_budget(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("aqgate-bounds-{}", &aqgate_core::engine::session::random_id()[..12]));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let config = dir.join("aqgate.toml");
    std::fs::write(&config, "[buffered]\nmax_bytes = 800000\n").expect("config file");
    let _serve = serve(&db, port, &["--config", config.to_str().expect("utf-8 path")], &[]);
    let recipients = names(1000, 200);
    for _ in 0..8 {
        let r = http(port, &publish(std::slice::from_ref(&recipients), "BUFFERED")).await;
        assert!(matches!(r, Response::Publish(..)), "{r:?}");
        let held = metric(port, "aqgate_buffered_bytes");
        assert!(held > 0 && held <= 800_000, "{held}");
    }
    let spilled = metric(port, "aqgate_buffered_budget_spilled_total");
    assert!(spilled >= 5, "each message holds over 200 kB: at most three fit ({spilled} spilled)");
    assert_eq!(depth(&db, TOPIC), spilled);
    assert_eq!(metric(port, "aqgate_buffered_budget_refused_total"), 0);
    let buffered = |c: &str| {
        receive(
            TOPIC,
            &format!(
                r#"<consumer_name>{c}</consumer_name><wait_time>0</wait_time><visibility>IMMEDIATE</visibility><aqgate:delivery_mode xmlns:aqgate="urn:aqgate:idap">BUFFERED</aqgate:delivery_mode>"#
            ),
            "",
        )
    };
    for c in [&recipients[0], &recipients[999]] {
        let mut got = 0;
        while let r @ Response::Receive(..) = http(port, &buffered(c)).await {
            assert_eq!(received(&r).len(), 1);
            got += 1;
        }
        assert_eq!(got, 8, "{c} got each message once");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_memory_is_bounded_by_the_process_budget_sqlite() {
    buffered_memory_is_bounded_by_the_process_budget(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_memory_is_bounded_by_the_process_budget_postgres() {
    buffered_memory_is_bounded_by_the_process_budget(Backend::Postgres).await;
}
