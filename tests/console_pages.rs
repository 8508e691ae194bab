//! The web console's operator pages, through `tower::ServiceExt::oneshot` on the router the
//! binary serves, over an engine on a fresh store (both backends where the store is
//! involved): a message's timeline (its enqueue, dequeues and rollbacks, the move to the
//! exception queue), a replay's dry run (nothing moves, the count shown) and its confirmed
//! run (the messages back, the audit rows on `/console/audit`), forced POSTs of lower roles
//! and of an operator without the privileges refused, the IDAP sessions listed and one
//! aborted, the spool and the notifications with stored markup shown only escaped, and the
//! "Copy as CLI" command lines shell-quoted. Then one replay in a real browser against a
//! real `aqgate serve`: the dry run, the confirmation dialog, the audit row, and no
//! console error or CSP violation on any of the new pages.

mod common;

use aqgate_http::servlet::{AppState, app};
use aqgate_proto::idap::Limits;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use common::console::{ROLE_AGENTS, basic, call};
use common::*;

const Q: &str = "AQUSER.RETRY";
const KEEP: &str = "AQUSER.KEEP";
const EQ: &str = "AQUSER.AQ$_RETRY_TAB_E";

/// The demo topology, a queue table whose messages fail over to its exception queue, one
/// agent per console role, and an operator who may dequeue from the exception queue but
/// not enqueue to the queues its messages go back to.
fn topology() -> String {
    format!(
        r#"{}
[[queue_tables]]
name = "AQUSER.RETRY_TAB"
payload_type = "RAW"

[[queues]]
name = "{Q}"
queue_table = "AQUSER.RETRY_TAB"
max_retries = 1

[[queues]]
name = "{KEEP}"
queue_table = "AQUSER.RETRY_TAB"
max_retries = 1
retention_time = 3600

[[propagations]]
name = "copy_job"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.RAW_ARCHIVE"

[[queues]]
name = "AQUSER.RAW_ARCHIVE"
queue_table = "AQUSER.RAW_TAB"

[[grants]]
user = "DEQONLY"
queue = "{EQ}"
privilege = "dequeue"

[[agents]]
name = "c_deq"
password = "pw"
db_users = ["DEQONLY"]
console = "operator"
{}"#,
        aqgate_admin::DEFAULT_TOPOLOGY,
        ROLE_AGENTS
    )
}

/// The router `aqgate serve` serves on a loopback listener, over a harness whose clock is
/// the wall clock's (replays and aborts stamp the wall clock's time).
async fn router(b: Backend) -> (axum::Router, Harness) {
    let h = Harness::with_topology(b, &topology()).await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("time").as_secs() as i64;
    h.clock.advance_secs((now - T0 / 1_000_000).max(0));
    let state = AppState::new(h.engine.clone(), Limits::default());
    let r = app(state.clone()).merge(aqgate_console::router(state, aqgate_console::ConsoleConfig::default()));
    (r, h)
}

fn get_as(path: &str, agent: &str) -> Request<Body> {
    common::console::get_as(path, Some(agent))
}

/// A POST as a same-origin page of the console sends it.
fn post_as(path: &str, agent: &str, form: &str) -> Request<Body> {
    common::console::post_as(path, Some(agent), form)
}

fn form(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect()
    };
    pairs.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect::<Vec<_>>().join("&")
}

/// `s` as the templates escape it (numeric character references).
fn html_escaped(s: &str) -> String {
    s.replace('&', "&#38;").replace('<', "&#60;").replace('>', "&#62;").replace('"', "&#34;").replace('\'', "&#39;")
}

fn html_unescaped(s: &str) -> String {
    s.replace("&#60;", "<").replace("&#62;", ">").replace("&#34;", "\"").replace("&#39;", "'").replace("&#38;", "&")
}

/// The texts of the page's `<code>` elements and of its `data-copy` attributes, unescaped.
fn command_lines(page: &str) -> (Vec<String>, Vec<String>) {
    let between = |open: &str, close: &str| -> Vec<String> {
        page.split(open).skip(1).filter_map(|s| s.find(close).map(|e| html_unescaped(&s[..e]))).collect()
    };
    (between("<code>", "</code>"), between("data-copy=\"", "\""))
}

/// Markup and script that must never reach a page as such.
const CORPUS: [&str; 3] =
    ["<script>alert(1)</script>", "\"><img src=x onerror=alert(1)>", "</textarea><iframe src=javascript:alert(1)>"];

fn assert_inert(page: &str, what: &str) {
    for bad in ["<script>alert", "<img src=x", "<iframe", "onerror=alert(1)>"] {
        assert!(!page.contains(bad), "{what}: {bad:?} unescaped in\n{page}");
    }
}

/// Sends a message with correlation `corr` to `queue` as JOHN, committed; its id.
async fn send(h: &Harness, queue: &str, corr: &str) -> String {
    let mut s = h.session("JOHN");
    let header = format!("<correlation>{}</correlation>", corr.replace('&', "&amp;").replace('<', "&lt;"));
    let r = h.run(&mut s, &raw_send(queue, &[(&header, "0A")], COMMIT)).await.expect("send");
    sent_ids(&r).remove(0)
}

/// Dequeues the next message of `queue` and rolls back, `times` times.
async fn roll_back(h: &Harness, queue: &str, times: usize) {
    let mut s = h.session("JOHN");
    for _ in 0..times {
        let got = h.run(&mut s, &receive(queue, "<wait_time>0</wait_time>", "")).await.expect("receive");
        assert_eq!(received(&got).len(), 1);
        h.run(&mut s, &envelope(ROLLBACK)).await.expect("rollback");
    }
}

/// Sends messages with correlations `corrs` to RETRY, each rolled back past max_retries:
/// in the exception queue (MAX_RETRY_EXCEEDED). Their ids.
async fn fail(h: &Harness, corrs: &[&str]) -> Vec<String> {
    let mut ids = Vec::new();
    for c in corrs {
        ids.push(send(h, Q, c).await);
        roll_back(h, Q, 2).await;
    }
    ids
}

async fn depths(h: &Harness) -> (i64, i64) {
    let rows = aqgate_admin::queues(h.engine.store().as_ref()).await.expect("queues");
    let d = |n: &str| rows.iter().find(|r| r.name == n).map_or(0, |r| r.depth);
    (d(Q), d(EQ))
}

fn timeline_path(queue: &str, id: &str) -> String {
    format!("/console/queues/{queue}/messages/{id}/timeline")
}

async fn a_timeline_shows_enqueue_dequeues_and_rollbacks(b: Backend) {
    let (r, h) = router(b).await;
    // Kept after its dequeue (retention): rolled back once, then taken.
    let kept = send(&h, KEEP, "K1").await;
    roll_back(&h, KEEP, 1).await;
    let mut s = h.session("JOHN");
    let got = h.run(&mut s, &receive(KEEP, "<wait_time>0</wait_time>", COMMIT)).await.expect("receive");
    assert_eq!(received(&got).len(), 1);
    // Rolled back past max_retries: moved to the exception queue.
    let failed = fail(&h, &["F1"]).await.remove(0);

    let a = call(&r, get_as(&timeline_path(KEEP, &kept), "c_reader")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let at = |what: &str| a.body.find(&format!("<td>{what}</td>")).unwrap_or_else(|| panic!("{what}: {}", a.body));
    assert!(at("enqueued") < at("dequeued") && at("dequeued") < at("processed"), "in time order: {}", a.body);
    assert!(a.body.contains("agent JOHN") && a.body.contains("correlation K1"), "{}", a.body);
    assert!(a.body.contains("after 1 failed dequeue(s)"), "the rollback before the dequeue: {}", a.body);
    assert!(a.body.contains(&format!("<td>{}", &aqgate_admin::timeline::time_text(T0)[..4])), "times shown");

    let a = call(&r, get_as(&timeline_path(EQ, &failed), "c_reader")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.body.contains("<td>enqueued</td>") && a.body.contains("<td>exception</td>"), "{}", a.body);
    assert!(
        a.body.contains(&html_escaped(&format!(
            "from {Q} to exception queue {EQ}: MAX_RETRY_EXCEEDED, after 2 failed dequeue(s)"
        ))),
        "{}",
        a.body
    );
    // The message's page links to it.
    let page = call(&r, get_as(&format!("/console/queues/{EQ}/messages/{failed}"), "c_reader")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body.contains(&html_escaped(&format!(
            "/console/queues/{}/messages/{failed}/timeline",
            "AQUSER.AQ%24_RETRY_TAB_E"
        ))),
        "{}",
        page.body
    );

    // Only the reader of that queue, and only for a message of it.
    assert_eq!(call(&r, get_as(&timeline_path(EQ, &failed), "c_viewer")).await.status, StatusCode::FORBIDDEN);
    assert_eq!(call(&r, get_as(&timeline_path(EQ, &failed), "c_oe")).await.status, StatusCode::FORBIDDEN);
    assert_eq!(call(&r, get_as(&timeline_path(KEEP, &failed), "c_reader")).await.status, StatusCode::NOT_FOUND);
    let none = "00000000000000000000000000000000";
    assert_eq!(call(&r, get_as(&timeline_path(KEEP, none), "c_reader")).await.status, StatusCode::NOT_FOUND);
    assert_eq!(call(&r, get_as(&timeline_path(KEEP, "%3Cb%3E"), "c_reader")).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeline_shows_enqueue_dequeues_and_rollbacks_sqlite() {
    a_timeline_shows_enqueue_dequeues_and_rollbacks(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeline_shows_enqueue_dequeues_and_rollbacks_postgres() {
    a_timeline_shows_enqueue_dequeues_and_rollbacks(Backend::Postgres).await;
}

async fn a_replay_runs_dry_then_confirmed(b: Backend) {
    let (r, h) = router(b).await;
    let ids = fail(&h, &["C0", "C1", "C2"]).await;
    assert_eq!(depths(&h).await, (0, 3));
    let path = format!("/console/queues/{EQ}/replay");

    // The exception queue's listing offers the replay; the form takes the CLI's filters.
    let list = call(&r, get_as(&format!("/console/queues/{EQ}/messages"), "c_operator")).await;
    assert!(list.body.contains("/console/queues/AQUSER.AQ%24_RETRY_TAB_E/replay"), "{}", list.body);
    let a = call(&r, get_as(&path, "c_operator")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    for field in ["name=\"msgids\"", "name=\"correlation\"", "name=\"reason\"", "name=\"max\"", "name=\"batch\""] {
        assert!(a.body.contains(field), "{field}: {}", a.body);
    }

    // The dry run: the count, nothing moved, no audit row, the confirmation form.
    let a = call(&r, post_as(&path, "c_operator", &form(&[("reason", "MAX_RETRY_EXCEEDED"), ("batch", "2")]))).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.body.contains(&format!("3 message(s) would be replayed to {Q}; nothing changed")), "{}", a.body);
    assert!(a.body.contains("data-confirm=") && a.body.contains("name=\"confirm\" value=\"yes\""), "{}", a.body);
    for id in &ids {
        assert!(a.body.contains(id.as_str()), "{id} listed: {}", a.body);
    }
    assert_eq!(depths(&h).await, (0, 3), "a dry run moves nothing");
    let audit = aqgate_admin::replay::audit(h.engine.store().as_ref(), 100).await.expect("audit");
    assert!(audit.is_empty(), "{audit:?}");

    // Confirmed: moved back in two batches, an audit row each.
    let confirmed = form(&[("reason", "MAX_RETRY_EXCEEDED"), ("batch", "2"), ("max", "100"), ("confirm", "yes")]);
    let a = call(&r, post_as(&path, "c_operator", &confirmed)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(
        a.body.contains(&format!("Replayed 3 of 3 matching message(s) of {EQ} to {Q} in 2 batch(es)")),
        "{}",
        a.body
    );
    assert!(a.body.contains("2 audit row(s) written"), "{}", a.body);
    assert_eq!(depths(&h).await, (3, 0));
    let audit = aqgate_admin::replay::audit(h.engine.store().as_ref(), 100).await.expect("audit");
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert!(
        audit.iter().all(|a| a.actor == "C_OPERATOR" && a.queue == EQ && a.filter == "--reason MAX_RETRY_EXCEEDED")
    );
    // Each original id shown beside its new message's.
    let (rows, _) = aqgate_admin::messages::messages(h.engine.store().as_ref(), Q, None, 100).await.expect("rows");
    let col = |r: &[(&str, Option<String>)], c: &str| r.iter().find(|(n, _)| *n == c).and_then(|(_, v)| v.clone());
    for row in &rows {
        let (new, orig) = (col(row, "msg_id").expect("id"), col(row, "original_msgid").expect("original"));
        assert!(ids.contains(&orig), "{orig}");
        let line = a.body.lines().find(|l| l.contains(&orig)).unwrap_or_else(|| panic!("{orig}: {}", a.body));
        assert!(line.contains(&new), "{orig} replayed as {new}: {line}");
    }

    // The audit log page.
    let page = call(&r, get_as("/console/audit", "c_operator")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("C_OPERATOR") && page.body.contains(&html_escaped(EQ)), "{}", page.body);
    for id in &ids {
        assert!(page.body.contains(id.as_str()), "{id}: {}", page.body);
    }
    assert_eq!(call(&r, get_as("/console/audit", "c_admin")).await.status, StatusCode::OK);
    let other = call(&r, get_as("/console/audit", "c_oe")).await;
    assert!(other.status == StatusCode::OK && !other.body.contains(ids[0].as_str()), "not OE's queue: {}", other.body);
    // The replayed original's timeline shows the replay.
    let t = call(&r, get_as(&timeline_path(EQ, &ids[0]), "c_reader")).await;
    assert_eq!(t.status, StatusCode::OK, "{}", t.body);
    assert!(t.body.contains("<td>audit</td>") && t.body.contains("replay by C_OPERATOR"), "{}", t.body);

    // Nothing left: a replay of nothing is a dry run of 0; not an exception queue: 404; a
    // malformed filter: 400.
    let a = call(&r, post_as(&path, "c_operator", "")).await;
    assert!(a.body.contains("0 message(s) would be replayed"), "{}", a.body);
    assert_eq!(
        call(&r, get_as(&format!("/console/queues/{Q}/replay"), "c_operator")).await.status,
        StatusCode::NOT_FOUND
    );
    for bad in [form(&[("msgids", "xyz")]), form(&[("reason", "SOMETIME")]), form(&[("max", "many")])] {
        assert_eq!(call(&r, post_as(&path, "c_operator", &bad)).await.status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_runs_dry_then_confirmed_sqlite() {
    a_replay_runs_dry_then_confirmed(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_runs_dry_then_confirmed_postgres() {
    a_replay_runs_dry_then_confirmed(Backend::Postgres).await;
}

/// Each role against each new route, and POSTs forced by roles below the action's, or by
/// an operator without the queue privileges: 403, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_against_each_new_route_and_forced_posts_refused() {
    let (r, h) = router(Backend::Sqlite).await;
    let ids = fail(&h, &["R0"]).await;
    let t = timeline_path(EQ, &ids[0]);
    let replay = format!("/console/queues/{EQ}/replay");
    let gets = [
        (t.as_str(), [403, 403, 200, 200, 200]),
        (replay.as_str(), [403, 403, 403, 200, 200]),
        ("/console/audit", [403, 403, 403, 200, 200]),
        ("/console/spool", [403, 403, 403, 200, 200]),
        ("/console/notifications", [403, 403, 403, 200, 200]),
        ("/console/sessions", [403, 403, 403, 403, 200]),
    ];
    let roles = ["c_none", "c_viewer", "c_reader", "c_operator", "c_admin"];
    for (path, want) in gets {
        for (agent, want) in roles.iter().zip(want) {
            let a = call(&r, get_as(path, agent)).await;
            assert_eq!(a.status.as_u16(), want, "{agent} GET {path}: {}", a.body);
            assert!(a.headers.get("content-security-policy").is_some(), "{agent} GET {path}");
        }
    }
    // Forced POSTs below operator (a replay) and below admin (an abort).
    let confirmed = form(&[("confirm", "yes")]);
    for agent in ["c_none", "c_viewer", "c_reader"] {
        let a = call(&r, post_as(&replay, agent, &confirmed)).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{agent}: {}", a.body);
    }
    // An operator who may dequeue from the exception queue but not enqueue to its queues,
    // and an admin of another schema.
    for agent in ["c_deq", "c_oe"] {
        assert_eq!(call(&r, get_as(&replay, agent)).await.status, StatusCode::FORBIDDEN, "{agent}");
        let a = call(&r, post_as(&replay, agent, &confirmed)).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{agent}: {}", a.body);
    }
    let a = call(&r, get_as(&replay, "c_deq")).await;
    assert!(a.body.contains("You may not enqueue to AQUSER."), "{}", a.body);
    assert_eq!(depths(&h).await, (0, 1), "nothing replayed");
    assert!(aqgate_admin::replay::audit(h.engine.store().as_ref(), 10).await.expect("audit").is_empty());

    let mut s = h.session("JOHN");
    h.run(&mut s, &raw_send(Q, &[("", "0B")], "")).await.expect("an open send");
    let pending = || async {
        let all = aqgate_admin::sessions::sessions(h.engine.store().as_ref()).await.expect("sessions");
        all.into_iter().filter(|s| s.pending).collect::<Vec<_>>()
    };
    let open = pending().await;
    assert_eq!(open.len(), 1, "{open:?}");
    let abort = format!("/console/sessions/{}/abort", open[0].id);
    for agent in ["c_none", "c_viewer", "c_reader", "c_operator"] {
        let a = call(&r, post_as(&abort, agent, "")).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{agent}: {}", a.body);
    }
    // And a cross-site one, by the admin.
    let forged = Request::post(&abort)
        .header(header::AUTHORIZATION, basic("c_admin"))
        .header("sec-fetch-site", "cross-site")
        .body(Body::empty())
        .expect("request");
    assert_eq!(call(&r, forged).await.status, StatusCode::FORBIDDEN);
    assert_eq!(pending().await, open, "still open");
}

async fn sessions_are_listed_and_one_aborted(b: Backend) {
    let (r, h) = router(b).await;
    let mut s = h.session("JOHN");
    h.run(&mut s, &raw_send(Q, &[("<correlation>K</correlation>", "0A")], COMMIT)).await.expect("send");
    let got = h.run(&mut s, &receive(Q, "<wait_time>0</wait_time>", "")).await.expect("receive");
    assert_eq!(received(&got).len(), 1);
    let open = aqgate_admin::sessions::sessions(h.engine.store().as_ref()).await.expect("sessions");
    assert_eq!(open.len(), 1, "{open:?}");
    let id = open[0].id.clone();

    let a = call(&r, get_as("/console/sessions", "c_admin")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let row = a.body.split("<tr>").find(|row| row.contains(&format!("<td>{id}</td>"))).expect("the session's row");
    assert!(row.contains("<td>JOHN</td>") && row.contains("<td class=\"num\">1</td>"), "one locked: {row}");
    assert!(
        row.contains(&format!("action=\"/console/sessions/{id}/abort\"")) && row.contains("data-confirm="),
        "{row}"
    );
    let (code, copy) = command_lines(row);
    assert_eq!(code, [format!("aqgate admin sessions --abort {id}")]);
    assert_eq!(copy, code);

    let a = call(&r, post_as(&format!("/console/sessions/{id}/abort"), "c_admin", "")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.body.contains(&format!("Session {id} of agent JOHN ended: its transaction rolled back")), "{}", a.body);
    assert!(aqgate_admin::sessions::sessions(h.engine.store().as_ref()).await.expect("sessions").is_empty());
    assert_eq!(depths(&h).await, (1, 0), "the locked message back");
    let a = call(&r, get_as("/console/sessions", "c_admin")).await;
    assert!(a.body.contains("No open session.") && !a.body.contains(&id), "{}", a.body);
    assert!(h.run(&mut s, &envelope(COMMIT)).await.is_err(), "the aborted session's commit is refused");
    // Aborting it again, or a malformed id: 400, said why.
    for bad in [id.as_str(), "zz"] {
        let a = call(&r, post_as(&format!("/console/sessions/{bad}/abort"), "c_admin", "")).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{bad}: {}", a.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_listed_and_one_aborted_sqlite() {
    sessions_are_listed_and_one_aborted(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_listed_and_one_aborted_postgres() {
    sessions_are_listed_and_one_aborted(Backend::Postgres).await;
}

fn register(dest: &str, url: &str) -> String {
    envelope(&format!(
        r#"<AQXmlRegister xmlns="http://ns.oracle.com/AQ/schemas/access"><register_options><destination>{dest}</destination><notify_url>{url}</notify_url></register_options><AQXmlCommit/></AQXmlRegister>"#
    ))
}

async fn spool_and_notifications_render_escaped(b: Backend) {
    let (r, h) = router(b).await;
    let store = h.engine.store();
    // Three mails whose Message-ID, subject and last error are the corpus; the newest first.
    for (i, text) in CORPUS.iter().enumerate() {
        let mut m = spooled(&format!("{text}-{i}"), "<x/>");
        m.subject = Some(text.to_string());
        m.received_at = T0 + i as i64;
        let id = match store.spool_put(&m).await.expect("spool") {
            aqgate_core::store::SpoolPut::New(id) | aqgate_core::store::SpoolPut::Duplicate(id) => id,
        };
        store.spool_attempted(id, None, Some(text), Some(T0 + 3_600_000_000)).await.expect("attempted");
    }
    let a = call(&r, get_as("/console/spool", "c_operator")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_inert(&a.body, "spool");
    for text in CORPUS {
        assert!(a.body.contains(&html_escaped(text)), "{text}: {}", a.body);
    }
    let newest = a.body.find(&html_escaped(&format!("{}-2", CORPUS[2]))).expect("the newest");
    let oldest = a.body.find(&html_escaped(&format!("{}-0", CORPUS[0]))).expect("the oldest");
    assert!(newest < oldest, "newest first");
    assert!(a.body.contains("verified: signed by SCOTT") && a.body.contains("scott@example.com"), "{}", a.body);
    let one = call(&r, get_as("/console/spool?limit=1", "c_operator")).await;
    assert!(one.body.contains("-2") && !one.body.contains(&html_escaped(&format!("{}-0", CORPUS[0]))), "bounded");

    // A registration with a token in its query, and a parked notification whose error is markup.
    let mut s = h.session("scott");
    h.run(&mut s, &register("AQUSER.RAW_QUE", "http://93.184.216.34/notify?token=S3CRET")).await.expect("register");
    h.run(&mut s, &raw_send("AQUSER.RAW_QUE", &[("", "0A")], COMMIT)).await.expect("send");
    let pending = store.notify_pending(10).await.expect("outbox");
    assert_eq!(pending.len(), 1, "{pending:?}");
    store.notify_failed(pending[0].id, CORPUS[0], None).await.expect("parked");
    let a = call(&r, get_as("/console/notifications", "c_operator")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_inert(&a.body, "notifications");
    assert!(a.body.contains(&html_escaped(CORPUS[0])), "{}", a.body);
    assert!(a.body.contains("0 pending, 1 parked") && a.body.contains("<td>parked</td>"), "{}", a.body);
    assert!(a.body.contains("http://93.184.216.34/notify?redacted") && !a.body.contains("S3CRET"), "{}", a.body);
    assert!(a.body.contains(&pending[0].notification_id()), "{}", a.body);
    // Not OE's.
    let other = call(&r, get_as("/console/notifications", "c_oe")).await;
    assert!(!other.body.contains("93.184.216.34"), "{}", other.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spool_and_notifications_render_escaped_sqlite() {
    spool_and_notifications_render_escaped(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spool_and_notifications_render_escaped_postgres() {
    spool_and_notifications_render_escaped(Backend::Postgres).await;
}

/// Every action's command line, as shown and as copied, is the one `aqgate admin` takes,
/// each argument shell-quoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_as_cli_is_shell_quoted() {
    let (r, h) = router(Backend::Sqlite).await;
    let corr = "it's <b>x</b> $HOME";
    fail(&h, &[corr]).await;

    let a = call(&r, get_as("/console/", "c_operator")).await;
    let (code, copy) = command_lines(&a.body);
    assert_eq!(code, ["aqgate admin jobs --disable COPY_JOB", "aqgate admin jobs --reset COPY_JOB"], "{}", a.body);
    assert_eq!(copy, code);
    call(&r, post_as("/console/jobs/copy_job/disable", "c_operator", "")).await;
    let (code, _) = command_lines(&call(&r, get_as("/console/", "c_operator")).await.body);
    assert_eq!(code, ["aqgate admin jobs --enable COPY_JOB", "aqgate admin jobs --reset COPY_JOB"]);

    let path = format!("/console/queues/{EQ}/replay");
    let a = call(&r, get_as(&path, "c_operator")).await;
    let (code, copy) = command_lines(&a.body);
    assert_eq!(code, [format!("aqgate admin replay '{EQ}' --max 100 --batch 100 --dry-run --as C_OPERATOR")]);
    assert_eq!(copy, code);

    let a = call(&r, post_as(&path, "c_operator", &form(&[("correlation", corr), ("max", "20000")]))).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.body.contains("1 message(s) would be replayed"), "{}", a.body);
    assert!(!a.body.contains("<b>x</b>"), "escaped: {}", a.body);
    let quoted = r"'it'\''s <b>x</b> $HOME'";
    let (code, copy) = command_lines(&a.body);
    assert_eq!(
        code,
        [
            format!("aqgate admin replay '{EQ}' --correlation {quoted} --max 10000 --batch 100 --as C_OPERATOR"),
            format!(
                "aqgate admin replay '{EQ}' --correlation {quoted} --max 10000 --batch 100 --dry-run --as C_OPERATOR"
            ),
        ],
        "the cap clamped to 10000"
    );
    assert_eq!(copy, code);
    // What the shell makes of it: the arguments as given.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("printf '%s\\n' {}", code[0].trim_start_matches("aqgate admin ")))
        .output()
        .expect("sh");
    let words: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
    assert_eq!(words, ["replay", EQ, "--correlation", corr, "--max", "10000", "--batch", "100", "--as", "C_OPERATOR"]);
}

/// One replay in a real browser against `aqgate serve`: the login form, the dry run, the
/// confirmation dialog accepted, the report and the audit row; each new page with no
/// console error and no CSP violation, the Copy button among them.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_in_a_real_browser() {
    use common::browser::Browser;
    use fantoccini::Locator;

    let file = demo_topology_with(
        "console-pages",
        &format!(
            "{ROLE_AGENTS}\n[[queue_tables]]\nname = \"AQUSER.RETRY_TAB\"\npayload_type = \"RAW\"\n\n[[queues]]\nname = \"{Q}\"\nqueue_table = \"AQUSER.RETRY_TAB\"\n"
        ),
    );
    let db = fresh_sqlite_url();
    let port = free_port();
    let _server = common::gateway::serve("console-pages", &db, port, &file);
    // Two messages that expire at once: the time manager moves them to the exception queue.
    let msgs = "<correlation>B1</correlation><expiration>1</expiration>";
    let body = raw_send(Q, &[(msgs, "0A"), (msgs, "0B")], COMMIT);
    idap(port, "john", "welcome", &body).await;
    wait_depth(&db, EQ, 2, std::time::Duration::from_secs(60));

    let base = format!("http://127.0.0.1:{port}/console");
    let b = Browser::start().await;
    let c = b.client();
    b.visit(&format!("{base}/login")).await;
    c.find(Locator::Css("input[name=agent]")).await.expect("agent").send_keys("c_admin").await.expect("type");
    c.find(Locator::Css("input[name=password]")).await.expect("password").send_keys("pw").await.expect("type");
    c.find(Locator::Css("form.login button")).await.expect("log in").click().await.expect("click");
    // The page after the login, once it has loaded (its logout form), not the one before.
    c.wait()
        .at_most(std::time::Duration::from_secs(10))
        .for_element(Locator::Css("form[action='/console/logout']"))
        .await
        .expect("the page after the login");
    b.assert_clean("after the login").await;
    assert!(b.text().await.contains("C_ADMIN (admin)"), "logged in");
    for page in ["audit", "spool", "notifications", "sessions"] {
        let text = b.visit(&format!("{base}/{page}")).await;
        assert!(!text.is_empty(), "{page}");
    }

    let text = b.visit(&format!("{base}/queues/{EQ}/replay")).await;
    assert!(text.contains("Replay from"), "{text}");
    let copy = c.find(Locator::Css("p.cli button[data-copy]")).await.expect("the Copy button");
    copy.click().await.expect("click Copy");
    b.assert_clean("Copy").await;
    c.find(Locator::Css("form.replay button")).await.expect("dry run").click().await.expect("click");
    c.wait()
        .at_most(std::time::Duration::from_secs(10))
        .for_element(Locator::Css("form.confirm"))
        .await
        .unwrap_or_else(|e| panic!("the dry run's answer: {e}"));
    b.assert_clean("the dry run").await;
    let text = b.text().await;
    assert!(text.contains(&format!("2 message(s) would be replayed to {Q}")), "{text}");
    assert_eq!(depth(&db, EQ), 2, "the dry run moved nothing");

    c.find(Locator::Css("form.confirm button")).await.expect("the confirmation").click().await.expect("click");
    let asked = c.get_alert_text().await.expect("the confirmation dialog");
    assert!(asked.starts_with(&format!("Replay 2 message(s) of {EQ} to {Q}")), "{asked}");
    c.accept_alert().await.expect("accept");
    c.wait().for_element(Locator::Css("p.done")).await.expect("the report");
    b.assert_clean("the replay").await;
    let text = b.text().await;
    assert!(text.contains("Replayed 2 of 2") && text.contains("1 audit row(s) written"), "{text}");
    assert_eq!((depth(&db, Q), depth(&db, EQ)), (2, 0));

    let text = b.visit(&format!("{base}/audit")).await;
    assert!(text.contains("C_ADMIN") && text.contains(EQ), "{text}");
    b.close().await;
}
