//! Long polls through the real binary, on both backends: one agent's receives waiting at
//! once are capped (`--max-long-polls-per-agent`); one more is answered at once as a
//! receive that does not wait (the message if one is there, else 25228 saying why), other
//! agents' receives still wait, and a matching message still wakes the right waiter.
//! Many waiting receives that no new message can serve cost another agent's sends nothing:
//! a commit's messages are judged in memory by each waiter, not by a scan of the queue —
//! also the commit of a transaction that spans requests.

mod common;

use std::time::{Duration, Instant};

use aqgate_proto::idap::Response;
use common::*;

const Q: &str = "AQUSER.RAW_QUE";

fn by_correlation(corr: &str, wait: u64) -> String {
    receive(Q, &format!("<wait_time>{wait}</wait_time><selector><correlation>{corr}</correlation></selector>"), COMMIT)
}

async fn metric(port: u16, name: &str) -> u64 {
    let m =
        reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.expect("metrics").text().await.expect("text");
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {name} in\n{m}"))
}

/// Waits (bounded) until `n` receives are waiting.
async fn waiting(port: u16, n: u64) {
    // Generous: a test's waiters may each need a password check first (two at a time).
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(port, "aqgate_long_polls_waiting").await != n {
        assert!(Instant::now() < deadline, "never {n} receives waiting");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn one_agents_long_polls_are_capped(db: String) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut server = Proc::spawn(
        "aqgate serve",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", &db])
            .env("AQGATE_MAX_LONG_POLLS_PER_AGENT", "3"),
    );
    server.wait_ready(port, Duration::from_secs(60));

    // john has three receives waiting for a message that is not there.
    let waiters: Vec<_> = (0..3)
        .map(|_| tokio::spawn(async move { idap(port, "john", "welcome", &by_correlation("LATER", 30)).await }))
        .collect();
    waiting(port, 3).await;

    // A fourth is answered at once, saying why.
    let t = Instant::now();
    let r = idap(port, "john", "welcome", &by_correlation("LATER", 30)).await;
    assert!(t.elapsed() < Duration::from_secs(3), "the fourth long poll waited {:?}", t.elapsed());
    match &r {
        Response::Fault(f) => {
            assert_eq!(f.code, aqgate_core::error::code::NO_MESSAGE, "{f:?}");
            assert!(f.message.contains("max-long-polls-per-agent"), "{}", f.message);
        }
        other => panic!("not a fault: {other:?}"),
    }
    assert_eq!(metric(port, "aqgate_long_polls_refused_total").await, 1);

    // It is a receive that does not wait: a message that is there, it gets.
    let r = idap(port, "scott", "tiger", &raw_send(Q, &[("<correlation>NOW</correlation>", "01")], COMMIT)).await;
    assert!(matches!(r, Response::Send(..)), "{r:?}");
    let r = idap(port, "john", "welcome", &by_correlation("NOW", 30)).await;
    assert_eq!(received(&r).len(), 1, "{r:?}");

    // Another agent's receives still wait (for its own wait_time).
    let t = Instant::now();
    let r = idap(port, "scott", "tiger", &by_correlation("LATER", 1)).await;
    assert!(t.elapsed() >= Duration::from_millis(900), "scott's receive did not wait: {r:?}");
    assert!(matches!(&r, Response::Fault(f) if !f.message.contains("max-long-polls-per-agent")), "{r:?}");

    // The matching message wakes one of john's waiters at once.
    let t = Instant::now();
    let r = idap(port, "scott", "tiger", &raw_send(Q, &[("<correlation>LATER</correlation>", "02")], COMMIT)).await;
    let id = sent_ids(&r).remove(0);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut waiters = waiters;
    let got = loop {
        if let Some(i) = waiters.iter().position(|w| w.is_finished()) {
            break waiters.remove(i).await.expect("waiter");
        }
        assert!(Instant::now() < deadline, "no waiter woke for the matching message");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(t.elapsed() < Duration::from_secs(2), "the waiter took {:?}", t.elapsed());
    let msgs = received(&got);
    assert_eq!(msgs.len(), 1, "{got:?}");
    assert_eq!(msgs[0].header.message_id.as_deref(), Some(id.as_str()));

    // One place is free again: another long poll of john's waits.
    waiting(port, 2).await;
    let t = Instant::now();
    let r = idap(port, "john", "welcome", &by_correlation("LATER", 1)).await;
    assert!(t.elapsed() >= Duration::from_millis(900), "john's long poll did not wait: {r:?}");
    assert_eq!(metric(port, "aqgate_long_polls_refused_total").await, 1);
    for w in waiters {
        w.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agents_long_polls_are_capped_on_sqlite() {
    one_agents_long_polls_are_capped(fresh_sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agents_long_polls_are_capped_on_postgres() {
    one_agents_long_polls_are_capped(fresh_pg_url().await).await;
}

/// A receive that waits for a priority-99 message.
fn priority_99(wait: u64) -> String {
    receive(
        Q,
        &format!("<wait_time>{wait}</wait_time><selector><condition>priority = 99</condition></selector>"),
        COMMIT,
    )
}

async fn waiters_that_cannot_match_cost_other_sends_nothing(db: String) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut server = Proc::spawn(
        "aqgate serve",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", &db])
            .env("AQGATE_MAX_LONG_POLLS_PER_AGENT", "250")
            // All 200 come from one address.
            .env("AQGATE_HTTP_MAX_CONNECTIONS_PER_IP", "0")
            // And all 200 log in at once, before any has put john's password in the cache of
            // recent checks: on a loaded machine a debug build's checks, two at a time, take
            // longer than the default 5 s a request waits for its turn.
            .env("AQGATE_PASSWORD_CHECK_WAIT_MS", "120000"),
    );
    server.wait_ready(port, Duration::from_secs(60));

    // john: 200 receives waiting for a message no send below has.
    let mut waiters: Vec<_> =
        (0..200).map(|_| tokio::spawn(async move { idap(port, "john", "welcome", &priority_99(120)).await })).collect();
    waiting(port, 200).await;

    // scott sends 100 messages, each committed: every commit reaches the queue john waits on.
    let mut took = Vec::with_capacity(100);
    for i in 0..100 {
        let t = Instant::now();
        let r = idap(port, "scott", "tiger", &raw_send(Q, &[("<priority>1</priority>", &format!("{i:02X}"))], COMMIT))
            .await;
        took.push(t.elapsed());
        assert!(matches!(r, Response::Send(..)), "{r:?}");
    }
    took.sort();
    let (p50, p99) = (took[49], took[98]);
    eprintln!("send latency with 200 waiting receives: p50 {p50:?}, p99 {p99:?}");
    assert!(p99 < Duration::from_millis(500), "sends slowed by the waiting receives: p50 {p50:?}, p99 {p99:?}");
    // The waiters judged what arrived without looking again, and all still wait.
    let judged = metric(port, "aqgate_long_poll_wakes_judged_total").await;
    assert!(judged >= 100 * 200 / 2);
    waiting(port, 200).await;

    // The same for transactions that span requests: 10 sessions each send twice, then
    // commit with AQXmlCommit (5) or with a third send's commit (5); every commit is
    // judged in memory too.
    for i in 0..10 {
        let mut cookie = None;
        for j in 0..2 {
            let r =
                idap_in(port, SCOTT, &mut cookie, &raw_send(Q, &[("<priority>1</priority>", &format!("{i}{j}"))], ""))
                    .await;
            assert!(matches!(r, Response::Send(..)), "{r:?}");
        }
        let end = if i % 2 == 0 {
            envelope(COMMIT)
        } else {
            raw_send(Q, &[("<priority>1</priority>", &format!("{i}F"))], COMMIT)
        };
        let r = idap_in(port, SCOTT, &mut cookie, &end).await;
        assert!(matches!(r, Response::Commit(_) | Response::Send(..)), "{r:?}");
    }
    let judged_sessions = metric(port, "aqgate_long_poll_wakes_judged_total").await - judged;
    assert!(judged_sessions >= 10 * 200 / 2, "session commits judged {judged_sessions} wake-ups in memory");
    waiting(port, 200).await;

    // A message that matches still wakes one of them at once.
    let t = Instant::now();
    let r = idap(port, "scott", "tiger", &raw_send(Q, &[("<priority>99</priority>", "99")], COMMIT)).await;
    let id = sent_ids(&r).remove(0);
    let deadline = Instant::now() + Duration::from_secs(5);
    let got = loop {
        if let Some(i) = waiters.iter().position(|w| w.is_finished()) {
            break waiters.remove(i).await.expect("waiter");
        }
        assert!(Instant::now() < deadline, "no waiter woke for the matching message");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(t.elapsed() < Duration::from_secs(2), "the waiter took {:?}", t.elapsed());
    let msgs = received(&got);
    assert_eq!(msgs.len(), 1, "{got:?}");
    assert_eq!(msgs[0].header.message_id.as_deref(), Some(id.as_str()));
    waiting(port, 199).await;
    for w in waiters {
        w.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_cannot_match_cost_other_sends_nothing_on_sqlite() {
    waiters_that_cannot_match_cost_other_sends_nothing(fresh_sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_cannot_match_cost_other_sends_nothing_on_postgres() {
    waiters_that_cannot_match_cost_other_sends_nothing(fresh_pg_url().await).await;
}
