//! Numbered RAW messages over HTTP, as the propagation tests send and count them: payload
//! `i` is `i` in eight hex digits, so what arrives tells what was sent.

use std::collections::BTreeSet;

use aqgate_proto::idap::Response;

use super::{COMMIT, http, raw_of, raw_send, receive, received, sent_ids};

/// Payload number `i`.
pub fn hex(i: usize) -> String {
    format!("{i:08X}")
}

/// Sends messages `from..from + n` to `queue` as scott, committed in requests of `per`,
/// `header` in each; their message ids.
pub async fn send_numbered(port: u16, queue: &str, from: usize, n: usize, per: usize, header: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut i = from;
    while i < from + n {
        let k = per.min(from + n - i);
        let payloads: Vec<String> = (i..i + k).map(hex).collect();
        let msgs: Vec<(&str, &str)> = payloads.iter().map(|p| (header, p.as_str())).collect();
        let r = http(port, &raw_send(queue, &msgs, COMMIT)).await;
        assert!(matches!(r, Response::Send(..)), "send to {queue}: {r:?}");
        ids.extend(sent_ids(&r));
        i += k;
    }
    ids
}

/// Every payload in `queue` (received and committed as scott).
pub async fn drain_payloads(port: u16, queue: &str) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let r = http(port, &receive(queue, "<wait_time>0</wait_time>", COMMIT)).await;
        match &r {
            Response::Receive(_, Some(_)) => out.extend(received(&r).iter().map(raw_of)),
            Response::Fault(f) if f.code == aqgate_core::error::code::NO_MESSAGE => return out,
            other => panic!("receive from {queue}: {other:?}"),
        }
    }
}

/// `got` holds each payload of `range` exactly once.
pub fn assert_exactly(got: &[String], range: std::ops::Range<usize>) {
    let distinct: BTreeSet<&String> = got.iter().collect();
    assert_eq!(got.len(), distinct.len(), "no message duplicated");
    let want: Vec<String> = range.map(hex).collect();
    assert_eq!(distinct.into_iter().cloned().collect::<Vec<_>>(), want, "no message lost");
}

/// The RAW queues the propagation tests move messages into, beside the demo's
/// `AQUSER.RAW_QUE` (all of its queue table `AQUSER.RAW_TAB`).
pub const RAW_QUEUES: &str = r#"
[[queues]]
name = "AQUSER.RAW_ARCHIVE"
queue_table = "AQUSER.RAW_TAB"

[[queues]]
name = "AQUSER.RAW_INBOX"
queue_table = "AQUSER.RAW_TAB"

[[queues]]
name = "AQUSER.RAW_REJECTS"
queue_table = "AQUSER.RAW_TAB"
"#;

/// Writes to `p` the demo topology, [`RAW_QUEUES`] and `extra`.
pub fn write_demo_topology(p: &std::path::Path, extra: &str) {
    std::fs::write(p, format!("{}\n{RAW_QUEUES}\n{extra}", aqgate_admin::DEFAULT_TOPOLOGY)).expect("write topology");
}

/// A new topology file (named after `tag`) of the demo topology, [`RAW_QUEUES`] and `extra`.
pub fn demo_topology_with(tag: &str, extra: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir()
        .join(format!("aqgate-test-{tag}-{}.toml", &aqgate_core::engine::session::random_id()[..12]));
    write_demo_topology(&p, extra);
    p
}
