//! The real `aqgate` binary: `serve` on its embedded defaults, `admin apply` / `admin
//! queues`, and crash safety (kill -9 with an open transaction, then restart).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use aqgate_proto::idap::Response;
use common::*;

/// `aqgate serve --no-smtp` on 127.0.0.1:`port` with `db` and `extra` flags, not waited for.
fn spawn_serve(db: &str, port: u16, extra: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    Proc::spawn("aqgate serve", aqgate(&["serve", "--no-smtp", "--listen", &listen, "--database", db]).args(extra))
}

/// The async runtime's worker threads of the server on `port` (the blocking pool's threads
/// have the same thread name, so they are not counted from /proc).
fn workers(port: u16) -> i64 {
    metric(port, "aqgate_runtime_worker_threads")
}

/// Starts `serve` and waits until `/readyz` answers 200: the store is open, the topology
/// applied and the servlet serving (the port alone is bound earlier).
fn serve(db: &str, port: u16, extra: &[&str]) -> Proc {
    let mut s = spawn_serve(db, port, extra);
    s.wait_ready(port, Duration::from_secs(60));
    s
}

fn admin(args: &[&str]) -> String {
    let out = Command::new(BIN).arg("admin").args(args).output().expect("run admin");
    assert!(out.status.success(), "admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn depth_of(listing: &str, queue: &str) -> i64 {
    listing
        .lines()
        .find(|l| l.split_whitespace().next() == Some(queue))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("{queue} not listed in:\n{listing}"))
}

/// A session lives in the store: kill -9 and a restart lose neither committed work nor an
/// open transaction, which its client continues with its cookie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_keeps_committed_work_and_open_sessions() {
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve(&db, port, &[]);
    let mut cookie = None;
    assert!(matches!(idap_in(port, SCOTT, &mut cookie, &example("01")).await, Response::Send(..)));
    assert!(matches!(idap_in(port, SCOTT, &mut cookie, &example("10")).await, Response::Commit(_)));
    // An open transaction: one more send and a pending remove of the committed order.
    assert!(matches!(idap_in(port, SCOTT, &mut cookie, &example("01")).await, Response::Send(..)));
    let r = idap_in(port, SCOTT, &mut cookie, &example("05")).await;
    assert!(matches!(r, Response::Receive(..)), "{r:?}");
    s.kill9();

    let listing = admin(&["queues", "--database", &db]);
    assert_eq!(depth_of(&listing, "QS.NEW_ORDERS_QUE"), 1, "committed order survives; the open send is not counted");

    let s = serve(&db, port, &[]);
    let mut cookie2 = None;
    let r = idap_in(port, SCOTT, &mut cookie2, &example("07")).await;
    assert!(
        matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::NO_MESSAGE),
        "the committed order is still locked by the open remove, the open send invisible: {r:?}"
    );
    let r = idap_in(port, SCOTT, &mut cookie, &example("10")).await;
    assert!(matches!(r, Response::Commit(_)), "the old session commits after the restart: {r:?}");
    let r = idap_in(port, SCOTT, &mut cookie2, &example("07")).await;
    assert!(
        matches!(&r, Response::Receive(_, Some(x)) if x.messages[0].header.correlation.as_deref() == Some("HLB-4471")),
        "the open send was published by that commit: {r:?}"
    );
    let r = idap_in(port, SCOTT, &mut cookie2, &example("07")).await;
    assert!(
        matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::NO_MESSAGE),
        "the first order was removed by that commit: {r:?}"
    );
    drop(s);
}

/// SAML settings in a build without the `saml` feature stop `serve` at start and
/// `config check`, naming the feature; in a build with it, they are taken (a metadata file
/// that does not exist is reported as such).
#[test]
fn saml_settings_are_refused_at_start_by_a_build_without_saml() {
    let missing = std::env::temp_dir().join(format!("aqgate-test-no-such-{}.xml", free_port()));
    let missing = missing.to_string_lossy().to_string();
    let listen = format!("127.0.0.1:{}", free_port());
    let args = ["serve", "--database", &fresh_sqlite_url(), "--listen", &listen, "--no-smtp"];
    let out = Command::new(BIN)
        .args(args)
        .args(["--saml-idp-metadata", &missing, "--saml-entity-id", "https://aq.example.com/sp"])
        .output()
        .expect("run serve");
    assert!(!out.status.success(), "serve must not start");
    let err = String::from_utf8_lossy(&out.stderr);
    if cfg!(feature = "saml") {
        assert!(err.contains(&missing) && !err.contains("feature"), "{err}");
    } else {
        assert!(err.contains(aqgate_http::SAML_FEATURE_MISSING), "{err}");
    }
    let file = std::env::temp_dir().join(format!("aqgate-test-saml-{}.toml", free_port()));
    std::fs::write(&file, format!("[saml]\nidp_metadata = {missing:?}\nentity_id = \"https://aq.example.com/sp\"\n"))
        .expect("write config");
    let out = Command::new(BIN).arg("--config").arg(&file).args(["config", "check"]).output().expect("config check");
    let _ = std::fs::remove_file(&file);
    let err = String::from_utf8_lossy(&out.stderr);
    // Either way `config check` says what would stop `serve`: the feature, or the file.
    assert!(!out.status.success(), "{err}");
    if cfg!(feature = "saml") {
        assert!(err.contains(&missing) && err.contains("would not start"), "{err}");
    } else {
        assert!(err.contains("saml.idp_metadata") && err.contains(aqgate_http::SAML_FEATURE_MISSING), "{err}");
    }
}

/// SQLite serves one process: a second `aqgate serve` on the same file is refused with a
/// clear message (and the first one goes on).
#[test]
fn a_second_server_on_one_sqlite_file_is_refused() {
    let db = fresh_sqlite_url();
    let port = free_port();
    let _first = serve(&db, port, &[]);
    let path = db.trim_start_matches("sqlite://").to_string();
    let link = format!("{path}-link.db");
    std::os::unix::fs::symlink(&path, &link).expect("symlink");
    // The same file, spelled another way each time.
    let encoded = format!("sqlite://{}", path.replace(".db", "%2Edb"));
    for url in [db.clone(), format!("sqlite:{path}"), format!("sqlite://{link}"), encoded] {
        let out = Command::new(BIN)
            .args(["serve", "--database", &url, "--listen", &format!("127.0.0.1:{}", free_port()), "--no-smtp"])
            .output()
            .expect("run a second server");
        assert!(!out.status.success(), "a second server on {url} must not start");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("another aqgate serve is running") && err.contains("PostgreSQL"), "{url}: {err}");
    }
    let _ = std::fs::remove_file(&link);
    assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(200), "the first one still serves");
}

/// A port another process holds stops the start with the address and the setting to
/// change; a command told not to run the one thing it runs is refused.
#[test]
fn a_taken_port_and_a_command_with_nothing_to_run_are_named() {
    let port = free_port();
    let _first = serve(&fresh_sqlite_url(), port, &[]);
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().expect("run");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let listen = format!("127.0.0.1:{port}");
    let (ok, err) = run(&["serve", "--no-smtp", "--listen", &listen, "--database", &fresh_sqlite_url()]);
    assert!(!ok && err.contains(&format!("cannot listen for HTTP on {listen} (--listen")), "{err}");
    let other = format!("127.0.0.1:{}", free_port());
    let (ok, err) = run(&["serve", "--listen", &other, "--smtp-listen", &listen, "--database", &fresh_sqlite_url()]);
    assert!(!ok && err.contains(&format!("cannot listen for SMTP on {listen} (--smtp-listen")), "{err}");
    let (ok, err) = run(&["smtp", "--no-smtp", "--database", &fresh_sqlite_url()]);
    assert!(!ok && err.contains("--no-smtp (smtp.enabled = false) leaves it nothing to run"), "{err}");
    let (ok, err) = run(&["notify", "--no-notify", "--database", &fresh_sqlite_url()]);
    assert!(!ok && err.contains("--no-notify (notify.enabled = false) leaves it nothing to run"), "{err}");
}

#[test]
fn admin_apply_is_idempotent_and_lists_queues() {
    let db = fresh_sqlite_url();
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/config/topology.toml");
    let first = admin(&["apply", file, "--database", &db]);
    assert!(first.contains("+ queue QS.NEW_ORDERS_QUE"), "{first}");
    assert!(first.contains("+ agent SCOTT"), "{first}");
    let second = admin(&["apply", file, "--database", &db]);
    assert_eq!(second.trim(), "no changes");
    let agents = admin(&["agents", "--database", &db]);
    let scott = agents.lines().find(|l| l.starts_with("SCOTT")).unwrap_or_else(|| panic!("{agents}"));
    assert!(scott.contains("http,smtp") && scott.contains("uid=scott,ou=people,dc=aqgate,dc=example"), "{scott}");
    let listing = admin(&["queues", "--database", &db]);
    for q in
        ["QS.NEW_ORDERS_QUE", "AQUSER.EMP_TOPIC", "AQUSER.JMS_TEXTQ", "OE.OE_NEW_ORDERS_QUE", "QS.AQ$_ORDERS_SQTAB_E"]
    {
        assert_eq!(depth_of(&listing, q), 0);
    }
    // A bad file is refused as a whole, with every problem named.
    let bad = std::env::temp_dir().join(format!("aqgate-bad-{}.toml", std::process::id()));
    std::fs::write(&bad, "[[queues]]\nname = \"A.B\"\nqueue_table = \"NOPE.T\"\n[[grants]]\nuser = \"X\"\nqueue = \"A.C\"\nprivilege = \"sometimes\"\n").expect("write");
    let out = Command::new(BIN).args(["admin", "apply"]).arg(&bad).args(["--database", &db]).output().expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("queues[0]") && err.contains("grants[0]"), "{err}");
    let _ = std::fs::remove_file(bad);
}

/// `aqgate admin queues | head -1`: the reader goes away after one line; aqgate ends
/// quietly instead of panicking on the broken pipe.
#[test]
fn admin_output_into_a_closed_pipe_is_not_a_panic() {
    use std::io::BufRead;
    let db = fresh_sqlite_url();
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/config/topology.toml");
    admin(&["apply", file, "--database", &db]);
    for _ in 0..3 {
        let mut child = Command::new(BIN)
            .args(["admin", "queues", "--database", &db])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut first = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        stdout.read_line(&mut first).expect("first line");
        assert!(first.starts_with("QUEUE"), "{first}");
        drop(stdout);
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(out.status.code(), Some(0), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_topology_applied_by_another_process() {
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve(&db, port, &[]);
    let send = raw_send("AQUSER.LATE_QUE", &[("", "0A")], COMMIT);
    let mut cookie = None;
    assert!(
        matches!(idap_in(port, SCOTT, &mut cookie, &send).await, Response::Fault(ref f) if f.code == aqgate_core::error::code::NO_SUCH_QUEUE)
    );
    let file = std::env::temp_dir().join(format!("aqgate-topo-{}.toml", std::process::id()));
    let extra = "\n[[queues]]\nname = \"AQUSER.LATE_QUE\"\nqueue_table = \"AQUSER.RAW_TAB\"\n";
    std::fs::write(&file, format!("{}{extra}", aqgate_admin::DEFAULT_TOPOLOGY)).expect("write topology");
    let out = admin(&["apply", file.to_str().expect("utf-8 path"), "--database", &db]);
    assert!(out.contains("+ queue AQUSER.LATE_QUE"), "{out}");
    s.signal("-HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match idap_in(port, SCOTT, &mut cookie, &send).await {
            Response::Send(..) => break,
            other => assert!(Instant::now() < deadline, "not reloaded: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_file(file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_then_exits_cleanly() {
    let db = fresh_sqlite_url();
    let port = free_port();
    // One worker thread: the long poll must not keep the other requests from being served.
    let mut s = serve(&db, port, &["--worker-threads", "1"]);
    assert_eq!(workers(port), 1, "--worker-threads 1");
    assert_eq!(metric(port, "aqgate_idap_requests_in_flight"), 0);
    let waiting = tokio::spawn(async move {
        let mut cookie = None;
        idap_in(port, SCOTT, &mut cookie, &receive("AQUSER.RAW_QUE", "<wait_time>3</wait_time>", COMMIT)).await
    });
    // Signal only once the long poll is inside the servlet (not merely connecting).
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::task::spawn_blocking(move || metric(port, "aqgate_idap_requests_in_flight")).await.expect("metric") < 1
    {
        assert!(Instant::now() < deadline, "the long poll never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.signal("-TERM");
    let r = waiting.await.expect("in-flight request answered");
    assert!(matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::NO_MESSAGE), "{r:?}");
    let status = s.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
}

/// The runtime's default size: with the database on this host (here a SQLite file), half
/// the CPUs, at least one; `--worker-threads` overrides it.
#[test]
fn a_local_database_gets_half_the_cpus_by_default() {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve(&db, port, &[]);
    assert_eq!(
        workers(port),
        i64::try_from((cpus / 2).max(1)).expect("cpus"),
        "default on {cpus} CPUs with a local database"
    );
    drop(s);
    let port = free_port();
    let _s = serve(&db, port, &["--worker-threads", "3"]);
    assert_eq!(workers(port), 3, "--worker-threads 3");
}

/// A SIGTERM while `serve` is still starting (the port is bound before the store is open
/// and the topology applied) is a clean stop, not death by signal.
#[test]
fn sigterm_while_starting_is_a_clean_exit() {
    let db = fresh_sqlite_url();
    let port = free_port();
    let mut s = spawn_serve(&db, port, &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(s.exited().is_none(), "exited before binding");
        assert!(Instant::now() < deadline, "aqgate serve did not bind");
        std::thread::sleep(Duration::from_millis(5));
    }
    s.signal("-TERM");
    let status = s.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
}

/// Runs the load generator (`aqgate-bench`) to the end; returns its result line.
fn run_bench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_aqgate-bench")).args(args).output().expect("run aqgate-bench");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

/// A `name=` number of the load generator's result line.
fn result_field(text: &str, name: &str) -> u64 {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {text}"))
}

/// The load generator (`aqgate-bench`, see BENCHMARKS.md) against the real server: its
/// own HTTP client keeps a session per client, and every message it reports as sent is
/// stored, and every one it reports as received was removed.
#[test]
fn the_load_generator_sends_and_receives_through_the_servlet() {
    let db = fresh_sqlite_url();
    let port = free_port();
    let _s = serve(&db, port, &[]);
    let url = aqserv(port);
    let bench = |scenario: &str| -> (u64, u64) {
        let text = run_bench(&[
            "--url",
            &url,
            "--scenario",
            scenario,
            "--clients",
            "2",
            "--seconds",
            "1",
            "--payload",
            "64",
            "--batch",
            "10",
            "--prefill",
            "2000",
        ]);
        (result_field(&text, "requests"), result_field(&text, "faults"))
    };
    let (sends, faults) = bench("send");
    assert!(sends > 0 && faults == 0, "send: {sends} requests, {faults} faults");
    assert_eq!(
        depth_of(&admin(&["queues", "--database", &db]), "AQUSER.RAW_QUE"),
        i64::try_from(sends).expect("count")
    );
    let (batches, faults) = bench("batch");
    assert!(batches > 0 && faults == 0, "batch: {batches} requests, {faults} faults");
    // A send, then its commit as a request of its own: every cycle commits its message.
    let (transacted, faults) = bench("transact");
    assert!(transacted > 0 && faults == 0, "transact: {transacted} cycles, {faults} faults");
    let before = depth_of(&admin(&["queues", "--database", &db]), "AQUSER.RAW_QUE");
    assert_eq!(before, i64::try_from(sends + 10 * batches + transacted).expect("count"));
    // The receive run first tops the queue up by 2,000 (in sets of 500), then removes.
    let (received, faults) = bench("receive");
    assert!(received > 0 && faults == 0, "receive: {received} requests, {faults} faults");
    let after = depth_of(&admin(&["queues", "--database", &db]), "AQUSER.RAW_QUE");
    assert_eq!(after, before + 2000 - i64::try_from(received).expect("count"));
}

/// The codec alone (`--scenario parse`): the load generator's batch request parses, and
/// the result line counts whole documents of `--batch` messages.
#[test]
fn the_load_generator_measures_the_codec_alone() {
    let text = run_bench(&["--scenario", "parse", "--clients", "2", "--seconds", "1", "--batch", "10"]);
    assert!(text.contains("scenario=Parse delivery=persistent clients=2 payload=1024B batch=10 "), "{text}");
    assert!(result_field(&text, "requests") > 0, "{text}");
    assert_eq!(result_field(&text, "faults"), 0, "{text}");
}

/// On PostgreSQL, concurrent committed sends from several client connections share
/// statements, and the writer recognises the connections that keep coming back (the
/// servlet passes each request's connection down to the store): over a few thousand
/// requests from four keep-alive clients, some batch waits for one of them. A regular
/// comes back within a millisecond, which a debug build on a loaded machine does only now
/// and then: the run goes again, up to ten times, until a batch has waited.
#[tokio::test(flavor = "multi_thread")]
async fn group_commit_on_postgres_groups_the_clients_that_keep_coming_back() {
    let db = fresh_pg_url().await;
    let port = free_port();
    let _s = serve(&db, port, &[]);
    let url = aqserv(port);
    let mut sends = 0;
    for _ in 0..10 {
        let text =
            run_bench(&["--url", &url, "--scenario", "send", "--clients", "4", "--seconds", "2", "--payload", "64"]);
        sends += i64::try_from(result_field(&text, "requests")).expect("count");
        assert_eq!(result_field(&text, "faults"), 0, "{text}");
        // The writer wrote every send (the warm-up requests of the load generator are receives).
        assert_eq!(metric(port, "aqgate_pg_insert_requests_total"), sends);
        let statements = metric(port, "aqgate_pg_insert_statements_total");
        assert!(statements > 0 && statements < sends, "{sends} sends in {statements} statements");
        if metric(port, "aqgate_pg_group_waits_total") > 0 {
            break;
        }
    }
    assert!(metric(port, "aqgate_pg_group_waits_total") > 0, "no batch waited for a regular in ten runs");
    assert_eq!(depth_of(&admin(&["queues", "--database", &db]), "AQUSER.RAW_QUE"), sends);
}

/// Two `aqgate serve` processes on one PostgreSQL database are one service: a session
/// opened through one continues through the other (no sticky sessions needed), a long
/// poll on one wakes for a commit through the other, and an idle session is rolled back
/// once, by whichever process finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_postgres_serve_any_session() {
    let db = fresh_pg_url().await;
    let (pa, pb) = (free_port(), free_port());
    let a = serve(&db, pa, &["--session-timeout", "2"]);
    let b = serve(&db, pb, &["--session-timeout", "2", "--no-topology"]);
    let mut cookie = None;
    assert!(matches!(idap_in(pa, SCOTT, &mut cookie, &example("01")).await, Response::Send(..)));
    assert!(cookie.is_some(), "open work gets a session");
    // A long poll on node a, woken by node b's commit of the session opened on a.
    let waiter = tokio::spawn(async move {
        let mut c = None;
        idap_in(pa, SCOTT, &mut c, &example("07").replace("<wait_time>0</wait_time>", "<wait_time>20</wait_time>"))
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        matches!(idap_in(pb, SCOTT, &mut cookie, &example("10")).await, Response::Commit(_)),
        "committed through b"
    );
    let r = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("woken").expect("task");
    assert!(
        matches!(&r, Response::Receive(_, Some(x)) if x.messages[0].header.correlation.as_deref() == Some("HLB-4471")),
        "{r:?}"
    );
    // A session each node wrote in turn: a's copy is stale when it commits, so the commit
    // runs again from the row and publishes both sends.
    let mut c2 = None;
    assert!(matches!(idap_in(pa, SCOTT, &mut c2, &example("01")).await, Response::Send(..)));
    assert!(matches!(idap_in(pb, SCOTT, &mut c2, &example("01")).await, Response::Send(..)));
    assert!(matches!(idap_in(pa, SCOTT, &mut c2, &example("10")).await, Response::Commit(_)));
    assert_eq!(depth_of(&admin(&["queues", "--database", &db]), "QS.NEW_ORDERS_QUE"), 2, "both sends");
    for _ in 0..2 {
        let mut c = None;
        assert!(matches!(idap_in(pb, SCOTT, &mut c, &example("07")).await, Response::Receive(..)));
    }
    // Open work through b, left idle: rolled back once, and either node says so.
    assert!(matches!(idap_in(pb, SCOTT, &mut cookie, &example("01")).await, Response::Send(..)));
    let stale = cookie.clone();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut c = stale.clone();
    let r = idap_in(pa, SCOTT, &mut c, &example("10")).await;
    assert!(matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::SESSION_EXPIRED), "{r:?}");
    let mut c = stale;
    let r = idap_in(pb, SCOTT, &mut c, &example("10")).await;
    assert!(matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::SESSION_EXPIRED), "{r:?}");
    assert_eq!(depth_of(&admin(&["queues", "--database", &db]), "QS.NEW_ORDERS_QUE"), 0, "rolled back");
    drop((a, b));
}

/// `--log-file` appends the log to a file (standard error then has none of it) at the
/// `--log-level` asked for; a filter that does not parse, or a file that cannot be opened,
/// stops the command with exit 2 before it runs.
#[test]
fn the_log_goes_where_and_as_much_as_asked() {
    let db = fresh_sqlite_url();
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("aqgate-test-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("log dir");
    let file = dir.join("aqgate.log");
    std::fs::write(&file, "an earlier line\n").expect("seed the log");
    let path = file.to_str().expect("utf-8");
    {
        let s = serve(&db, port, &["--log-file", path, "--log-level", "debug"]);
        let log = std::fs::read_to_string(&file).expect("read the log");
        assert!(log.starts_with("an earlier line\n"), "appended, not truncated: {log}");
        assert!(log.contains("aqgate servlet listening"), "{log}");
        assert!(log.contains("DEBUG"), "at the level asked for: {log}");
        assert!(!log.contains("\u{1b}["), "no terminal colours in a file");
        assert!(!s.log().contains("aqgate servlet listening"), "standard error has none of it");
    }
    for (flag, value, says) in
        [("--log-level", "info,[", "--log-level"), ("--log-file", "/nonexistent/dir/x.log", "--log-file")]
    {
        let out = Command::new(BIN).args([flag, value, "admin", "queues", "--database", &db]).output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
