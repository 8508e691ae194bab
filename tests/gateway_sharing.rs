//! Links whose jobs share their connections (`max_connections`), and gateway jobs on a
//! schedule, through a real `aqgate serve`, the machine's RabbitMQ and a NATS server of
//! the test's own (monitoring on): the connections counted at the broker by the name aqgate
//! gives them (`rabbitmqctl list_connections` with each one's channels; NATS's `/connz`),
//! in the aqgate process's sockets to the private NATS (`/proc/PID/fd` against
//! `/proc/PID/net/tcp`; a port no other test uses, connected to by the test only after
//! aqgate started, so no inherited socket counts) and in `admin gateway`; a connection closed by the broker takes
//! down only the jobs on it, which come back on one new connection with nothing lost or
//! doubled; a job outside its window moves nothing and holds no connection, and moves its
//! messages once the window opens.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::gateway::*;
use common::*;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

/// The socket inodes process `pid` holds open.
fn socket_inodes(pid: u32) -> BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().to_string();
                    l.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')).map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The established TCP connections of process `pid` to port `port` (both IP versions) that
/// are its own: a socket this test process holds too (inherited by the child when it was
/// spawned) is not counted.
fn sockets_to(pid: u32, port: u16) -> usize {
    let inherited = socket_inodes(std::process::id());
    let inodes: BTreeSet<String> = socket_inodes(pid).difference(&inherited).cloned().collect();
    let want = format!(":{port:04X}");
    let mut n = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl, local, remote, state (01: ESTABLISHED), …, inode (the tenth).
            if f.len() > 9 && f[2].ends_with(&want) && f[3] == "01" && inodes.contains(f[9]) {
                n += 1;
            }
        }
    }
    n
}

/// A NATS server with JetStream of this test's own, its monitoring endpoint on; killed and
/// its store removed when dropped.
struct PrivateNats {
    server: Option<Proc>,
    port: u16,
    monitor: u16,
    dir: std::path::PathBuf,
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        drop(self.server.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn private_nats() -> PrivateNats {
    let (port, monitor) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("aqgate-test-nats-{}", tag()));
    let (p, m) = (port.to_string(), monitor.to_string());
    let mut cmd = Command::new("nats-server");
    cmd.args(["-a", "127.0.0.1", "-p", &p, "-m", &m, "-js", "-sd"]).arg(&dir);
    let mut server = Proc::spawn("nats-server", &mut cmd);
    server.wait_port(port);
    server.wait_port(monitor);
    PrivateNats { server: Some(server), port, monitor, dir }
}

/// The connections NATS (monitoring on `monitor`) has from clients named `aqgate LINK`.
fn nats_connections(monitor: u16, link: &str) -> usize {
    let (status, body) = http_get(monitor, "/connz?limit=1024").expect("NATS's /connz");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("/connz JSON");
    let name = format!("aqgate {link}");
    v["connections"].as_array().map_or(0, |a| a.iter().filter(|c| c["name"] == name.as_str()).count())
}

/// `rabbitmqctl -q list_connections ARGS`'s output.
fn rabbitmqctl_list(args: &[&str]) -> Vec<u8> {
    let out = Command::new("rabbitmqctl").args(["-q", "list_connections"]).args(args).output().expect("rabbitmqctl");
    assert!(out.status.success(), "rabbitmqctl: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// RabbitMQ's connections named `aqgate LINK` (the name aqgate gives a link's connections):
/// each one's Erlang pid (as `close_connection` takes it) and channels.
fn rabbit_connections(link: &str) -> Vec<(String, u64)> {
    let all: serde_json::Value = serde_json::from_slice(&rabbitmqctl_list(&[
        "--formatter",
        "json",
        "peer_port",
        "channels",
        "client_properties",
    ]))
    .expect("rabbitmqctl's JSON");
    // The pids in the form close_connection takes, by peer port.
    let table = String::from_utf8(rabbitmqctl_list(&["--no-table-headers", "peer_port", "pid"])).expect("utf-8");
    let pids: std::collections::BTreeMap<u64, String> = table
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter_map(|(port, pid)| Some((port.trim().parse().ok()?, pid.trim().to_string())))
        .collect();
    let name = format!("\"aqgate {link}\"");
    let mut out: Vec<(String, u64)> = all
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|c| c["client_properties"].to_string().contains(&name))
                .map(|c| {
                    let port = c["peer_port"].as_u64().unwrap_or(0);
                    (pids.get(&port).cloned().unwrap_or_default(), c["channels"].as_u64().unwrap_or(0))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Link `name`'s row in `admin gateway --json` on `db`: (state, connections, max_connections).
fn link_row(db: &str, name: &str) -> (String, i64, Option<u64>) {
    let links = admin_json(db, "gateway");
    let r = links.as_array().and_then(|l| l.iter().find(|r| r["name"] == name)).cloned().unwrap_or_default();
    (
        r["state"].as_str().unwrap_or("-").to_string(),
        r["connections"].as_i64().unwrap_or(-1),
        r["max_connections"].as_u64(),
    )
}

fn job_lines(name: &str, source: &str, destination: &str, more: &str) -> String {
    format!(
        "\n[[gateway.jobs]]\nname = \"{name}\"\nsource = \"{source}\"\ndestination = \"{destination}\"\nbatch_size = 20\n{more}\n"
    )
}

fn foreign(name: &str, link: &str, lines: &str) -> String {
    format!("\n[[gateway.foreign_queues]]\nname = \"{name}\"\nlink = \"{link}\"\n{lines}\n")
}

async fn publish_numbered(ch: &lapin::Channel, t: &str, q: &str, range: std::ops::Range<usize>) {
    for i in range {
        let (body, props) = amqp_numbered(t, i);
        let c =
            ch.basic_publish("".into(), q.into(), BasicPublishOptions::default(), &body, props).await.expect("publish");
        assert!(c.await.expect("confirm").is_ack());
    }
}

/// Seven RabbitMQ jobs on two links: link R1 (max_connections left to its default of 1) with
/// one outbound and three inbound jobs makes one connection of four channels; link R2
/// (max_connections = 2) with three inbound jobs makes two. The broker closes one of R2's
/// connections: R2's jobs on it reconnect (two connections again), R1's connection and its
/// jobs are untouched, and every message arrives once.
#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_jobs_of_a_link_share_its_connections_and_fail_alone() {
    let t = tag();
    let (r1, r2) = (format!("R1_{}", t.to_uppercase()), format!("R2_{}", t.to_uppercase()));
    let q = |n: &str| format!("aqgt.{t}.{n}");
    let ins1 = ["i1a", "i1b", "i1c"];
    let ins2 = ["i2a", "i2b", "i2c"];
    let mut toml = String::new();
    for (link, extra) in [(&r1, ""), (&r2, "max_connections = 2")] {
        toml.push_str(&format!(
            "\n[[gateway.links]]\nname = \"{link}\"\nkind = \"rabbitmq\"\nurl = \"amqp://127.0.0.1:5672/%2f\"\n\
             username = \"guest\"\npassword_env = \"AQGT_RABBIT_PASSWORD\"\n{QUICK_RECONNECT}\n{extra}\n"
        ));
    }
    toml.push_str(&foreign("out", &r1, &format!("native_name = \"{}\"\ncreate = true", q("out"))));
    toml.push_str(&job_lines("to_rabbit", "AQUSER.RAW_QUE", &format!("out@{r1}"), ""));
    for (link, names) in [(&r1, &ins1), (&r2, &ins2)] {
        for n in names.iter() {
            toml.push_str(&foreign(n, link, &format!("native_name = \"{}\"\ncreate = true", q(n))));
            toml.push_str(&job_lines(&format!("from_{n}"), &format!("{n}@{link}"), "AQUSER.RAW_ARCHIVE", ""));
        }
    }
    let topo = demo_topology_with("gateway-sharing-rabbit", &toml);
    let ch = rabbit().await;
    for n in ins1.iter().chain(&ins2).chain(&["out"]) {
        ch.queue_declare(q(n).as_str().into(), QueueDeclareOptions::durable(), FieldTable::default())
            .await
            .expect("declare");
    }
    let db = fresh_pg_url().await;
    let port = free_port();
    let s = serve("gateway-sharing", &db, port, &topo);

    wait_until("R1 on one connection of four channels, R2 on two", Duration::from_secs(30), || {
        let (c1, c2) = (rabbit_connections(&r1), rabbit_connections(&r2));
        c1.len() == 1 && c1[0].1 == 4 && c2.len() == 2 && c2.iter().map(|c| c.1).sum::<u64>() == 3
    });
    wait_until("admin gateway counts them", Duration::from_secs(20), || {
        link_row(&db, &r1) == ("CONNECTED".into(), 1, Some(1)) && link_row(&db, &r2) == ("CONNECTED".into(), 2, Some(2))
    });

    // Every job moves its messages over the shared connections.
    let per = 10;
    send_numbered(port, "AQUSER.RAW_QUE", 0, per, 5, "").await;
    for (k, n) in ins1.iter().chain(&ins2).enumerate() {
        publish_numbered(&ch, &t, &q(n), (k * per)..((k + 1) * per)).await;
    }
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 6 * per as i64, Duration::from_secs(30));
    wait_until("the outbound job's messages at RabbitMQ", Duration::from_secs(30), || {
        depth(&db, "AQUSER.RAW_QUE") == 0
    });

    // The broker closes one of R2's connections: only its jobs notice.
    let r1_before = rabbit_connections(&r1);
    let (victim, _) = rabbit_connections(&r2)[0].clone();
    let out = Command::new("rabbitmqctl")
        .args(["-q", "close_connection", &victim, "closed by the test"])
        .output()
        .expect("rabbitmqctl close_connection");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (k, n) in ins1.iter().chain(&ins2).enumerate() {
        publish_numbered(&ch, &t, &q(n), (6 * per + k * per)..(6 * per + (k + 1) * per)).await;
    }
    wait_until("R2 on two connections again, without the closed one", Duration::from_secs(30), || {
        let c2 = rabbit_connections(&r2);
        c2.len() == 2 && c2.iter().all(|c| c.0 != victim) && c2.iter().map(|c| c.1).sum::<u64>() == 3
    });
    all_arrived(&db, port, 12 * per, "every inbound message once", Duration::from_secs(60)).await;
    assert_eq!(rabbit_connections(&r1), r1_before, "R1's connection and channels untouched");
    let jobs = admin_json(&db, "jobs");
    for n in ins1 {
        let j = job(&jobs, &format!("FROM_{}", n.to_uppercase()));
        assert_eq!(j["failed"], 0, "a job of R1 never failed: {j}");
    }
    assert_eq!(link_row(&db, &r2).1, 2);
    let got = rabbit_drain(&ch, &q("out")).await;
    let ids: BTreeSet<String> = got.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!((got.len(), ids.len()), (per, per), "the outbound job's messages once each");

    drop(s);
    wait_until("the connections close with the process", Duration::from_secs(20), || {
        rabbit_connections(&r1).is_empty() && rabbit_connections(&r2).is_empty()
    });
    for n in ins1.iter().chain(&ins2).chain(&["out"]) {
        let _ = ch.queue_delete(q(n).as_str().into(), Default::default()).await;
    }
    let _ = std::fs::remove_file(&topo);
}

/// Publishes numbered messages `range` to `subject` (Nats-Msg-Id `n-T-i`).
async fn nats_numbered(js: &async_nats::jetstream::Context, t: &str, subject: &str, range: std::ops::Range<usize>) {
    for i in range {
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("n-{t}-{i}").as_str());
        let body = bytes::Bytes::from(u32::try_from(i).expect("small").to_be_bytes().to_vec());
        js.publish_with_headers(subject.to_string(), h, body).await.expect("publish").await.expect("PubAck");
    }
}

/// Four NATS jobs (one outbound, three inbound from their own streams) on a link with the
/// default max_connections share one client: one connection at the server (`/connz`), one
/// TCP connection of the aqgate process to it, `1/1` in admin gateway (SQLite); every
/// message moves.
#[tokio::test(flavor = "multi_thread")]
async fn nats_jobs_of_a_link_share_one_client() {
    let t = tag();
    let link = format!("N_{}", t.to_uppercase());
    let up = t.to_uppercase();
    let nats = private_nats();
    let (nport, monitor) = (nats.port, nats.monitor);
    let mut toml =
        format!("\n[[gateway.links]]\nname = \"{link}\"\nkind = \"nats\"\nurl = \"nats://127.0.0.1:{nport}\"\n");
    let subject = |n: &str| format!("aqgt.{t}.{n}");
    let stream = |n: &str| format!("AQGT_{up}_{}", n.to_uppercase());
    toml.push_str(&foreign(
        "out",
        &link,
        &format!("native_name = \"{}\"\nstream = \"{}\"\ncreate = true", subject("out"), stream("out")),
    ));
    toml.push_str(&job_lines("to_nats", "AQUSER.RAW_QUE", &format!("out@{link}"), ""));
    let ins = ["a", "b", "c"];
    for n in ins {
        toml.push_str(&foreign(
            n,
            &link,
            &format!("native_name = \"{}\"\nstream = \"{}\"\ncreate = true", subject(n), stream(n)),
        ));
        toml.push_str(&job_lines(&format!("from_{n}"), &format!("{n}@{link}"), "AQUSER.RAW_ARCHIVE", ""));
    }
    let topo = demo_topology_with("gateway-sharing-nats", &toml);
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve("gateway-sharing-nats", &db, port, &topo);
    // The test's own client only now: aqgate cannot have inherited its socket.
    let js = jetstream(nport).await;
    for n in ins.iter().chain(&["out"]) {
        let config = async_nats::jetstream::stream::Config {
            name: stream(n),
            subjects: vec![subject(n)],
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        };
        js.get_or_create_stream(config).await.expect("stream");
    }
    wait_until("admin gateway: the link CONNECTED on one connection", Duration::from_secs(30), || {
        link_row(&db, &link) == ("CONNECTED".into(), 1, Some(1))
    });
    assert_eq!(nats_connections(monitor, &link), 1, "four jobs, one connection at the server");
    assert_eq!(sockets_to(s.id(), nport), 1, "four jobs, one TCP connection of the process");
    let out = aqgate(&["admin", "gateway", "--database", &db]).output().expect("admin gateway");
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    let header = table.lines().find(|l| l.starts_with("LINK ")).unwrap_or_default();
    let row = table.lines().find(|l| l.starts_with(&link)).unwrap_or_default();
    let at = header.find("CONNECTIONS").expect("a CONNECTIONS column");
    assert_eq!(row.get(at..).and_then(|r| r.split_whitespace().next()), Some("1/1"), "{table}");
    let per = 10;
    send_numbered(port, "AQUSER.RAW_QUE", 0, per, 5, "").await;
    for (k, n) in ins.iter().enumerate() {
        nats_numbered(&js, &t, &subject(n), (k * per)..((k + 1) * per)).await;
    }
    all_arrived(&db, port, 3 * per, "every inbound message once", Duration::from_secs(60)).await;
    assert_eq!(stream_messages(&js, &stream("out")).await, per as u64, "the outbound job's messages once each");
    assert_eq!((nats_connections(monitor, &link), sockets_to(s.id(), nport)), (1, 1));
    assert_eq!(link_row(&db, &link).1, 1);
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

fn unix_now() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs()).expect("seconds")
}

fn rfc3339(t: i64) -> String {
    chrono::DateTime::from_timestamp(t, 0).expect("time").to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Sleeps until the Unix time `t` (seconds).
async fn until(t: i64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let wait = t as f64 - now;
    if wait > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    }
}

/// Two gateway jobs with a window that opens 20 s after the start (6 s long, latency 1):
/// an outbound one to RabbitMQ and an inbound one from NATS. Before it opens they are
/// ENABLED with the window's opening in `admin jobs`, hold no lease and no connection (none
/// at either broker, none in the process's sockets) and move nothing of what waits on
/// either side; inside it both move everything; once it closes their connections close and
/// what comes later waits.
#[tokio::test(flavor = "multi_thread")]
async fn gateway_jobs_move_only_inside_their_schedules_window() {
    let t = tag();
    let (rl, nl) = (format!("RW_{}", t.to_uppercase()), format!("NW_{}", t.to_uppercase()));
    let (qout, subject, stream) =
        (format!("aqgt.{t}.w"), format!("aqgt.{t}.w"), format!("AQGT_{}_W", t.to_uppercase()));
    let nats = private_nats();
    let (nport, monitor) = (nats.port, nats.monitor);
    let start = unix_now() + 24;
    let schedule = format!("schedule = {{ start = \"{}\", duration = 6, latency = 1 }}", rfc3339(start));
    let mut toml = format!(
        "\n[[gateway.links]]\nname = \"{rl}\"\nkind = \"rabbitmq\"\nurl = \"amqp://127.0.0.1:5672/%2f\"\n\
         username = \"guest\"\npassword_env = \"AQGT_RABBIT_PASSWORD\"\n\
         \n[[gateway.links]]\nname = \"{nl}\"\nkind = \"nats\"\nurl = \"nats://127.0.0.1:{nport}\"\n"
    );
    toml.push_str(&foreign("out", &rl, &format!("native_name = \"{qout}\"\ncreate = true")));
    toml.push_str(&foreign("inb", &nl, &format!("native_name = \"{subject}\"\nstream = \"{stream}\"\ncreate = true")));
    toml.push_str(&job_lines("to_rabbit_w", "AQUSER.RAW_QUE", &format!("out@{rl}"), &schedule));
    toml.push_str(&job_lines("from_nats_w", &format!("inb@{nl}"), "AQUSER.RAW_ARCHIVE", &schedule));
    let topo = demo_topology_with("gateway-window", &toml);
    let ch = rabbit().await;
    ch.queue_declare(qout.as_str().into(), QueueDeclareOptions::durable(), FieldTable::default())
        .await
        .expect("declare");
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve("gateway-window", &db, port, &topo);
    // The test's own NATS client only now: aqgate cannot have inherited its socket.
    let js = jetstream(nport).await;
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![subject.clone()],
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
    .expect("stream");
    send_numbered(port, "AQUSER.RAW_QUE", 0, 3, 1, "").await;
    nats_numbered(&js, &t, &subject, 3..6).await;
    for name in ["TO_RABBIT_W", "FROM_NATS_W"] {
        let j = wait_job(&db, name, Duration::from_secs(10), |j| j["next_window"].is_string());
        assert_eq!(
            (j["state"].as_str(), j["next_window"].as_str()),
            (Some("ENABLED"), Some(rfc3339(start).as_str())),
            "{j}"
        );
        assert!(j["owner"].is_null(), "no lease outside the window: {j}");
    }
    assert!(unix_now() < start - 5, "the setup took too long for the window under test");
    // The checks before the window take a few seconds on a busy machine (rabbitmqctl).
    until(start - 3).await;
    assert_eq!(
        (depth(&db, "AQUSER.RAW_QUE"), depth(&db, "AQUSER.RAW_ARCHIVE")),
        (3, 0),
        "nothing moves before the window"
    );
    assert!(rabbit_connections(&rl).is_empty(), "no RabbitMQ connection before the window");
    assert_eq!(
        (nats_connections(monitor, &nl), sockets_to(s.id(), nport)),
        (0, 0),
        "no NATS connection before the window"
    );
    assert_eq!((link_row(&db, &rl).1, link_row(&db, &nl).1), (0, 0));

    // The window opens: both move what waited.
    wait_until("the window's messages moved both ways", Duration::from_secs(5), || {
        depth(&db, "AQUSER.RAW_QUE") == 0 && depth(&db, "AQUSER.RAW_ARCHIVE") == 3
    });
    assert!(unix_now() >= start, "moved only once the window opened");
    assert_eq!((rabbit_connections(&rl).len(), nats_connections(monitor, &nl)), (1, 1), "connected inside the window");
    let j = wait_job(&db, "TO_RABBIT_W", Duration::from_secs(5), |j| j["propagated"] == 3);
    assert!(j["state"] == "RUNNING" && j["next_window"].is_null(), "{j}");

    // It closes: the connections go, and what comes now waits.
    until(start + 6).await;
    wait_until("the connections closed with the window", Duration::from_secs(10), || {
        rabbit_connections(&rl).is_empty() && nats_connections(monitor, &nl) == 0 && sockets_to(s.id(), nport) == 0
    });
    send_numbered(port, "AQUSER.RAW_QUE", 6, 2, 1, "").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(depth(&db, "AQUSER.RAW_QUE"), 2, "after the window, messages wait");
    let got: BTreeSet<String> = rabbit_drain(&ch, &qout).await.into_iter().map(|(p, _)| p).collect();
    assert_eq!(got, (0..3).map(hex).collect::<BTreeSet<_>>());
    let got: BTreeSet<String> = drain_payloads(port, "AQUSER.RAW_ARCHIVE").await.into_iter().collect();
    assert_eq!(got, (3..6).map(hex).collect::<BTreeSet<_>>());
    drop(s);
    let _ = ch.queue_delete(qout.as_str().into(), Default::default()).await;
    let _ = js.delete_stream(&stream).await;
    let _ = std::fs::remove_file(&topo);
}
