//! `aqgate admin messages QUEUE` through the real binary, on both backends: the state
//! filter and the limit apply in the database (a WAIT message behind more READY ones than
//! shown is found), a listing cut short says so; and on PostgreSQL, the query it runs finds
//! a queue's rows through indexes in a database nobody has analyzed.

mod common;

use std::process::{Command, Output};

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_aqgate");

fn admin_messages(url: &str, queue: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["admin", "messages", queue, "--database", url])
        .args(args)
        .env_remove("AQGATE_CONFIG")
        .output()
        .expect("run admin messages")
}

fn ok(out: &Output) -> (String, String) {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    (stdout.to_string(), stderr.to_string())
}

/// The CORR_IDs of a `--json` listing.
fn corr_ids(stdout: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(stdout).expect("json");
    v.as_array().expect("an array").iter().map(|r| r["CORR_ID"].as_str().unwrap_or("").to_string()).collect()
}

/// A harness whose clock is the database's (the views compare delays with the latter).
async fn harness(b: Backend) -> Harness {
    let h = Harness::new(b).await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("time").as_secs() as i64;
    h.clock.advance_secs((now - T0 / 1_000_000).max(0));
    h
}

/// Sends `n` RAW messages to `queue`, committed, `header` to each (its `{i}`, the number).
async fn send(h: &Harness, queue: &str, n: usize, header: &str) {
    let mut s = h.session("JOHN");
    for start in (0..n).step_by(200) {
        let headers: Vec<String> = (start..n.min(start + 200)).map(|i| header.replace("{i}", &i.to_string())).collect();
        let msgs: Vec<(&str, &str)> = headers.iter().map(|hd| (hd.as_str(), "01")).collect();
        h.run(&mut s, &raw_send(queue, &msgs, COMMIT)).await.expect("send");
    }
}

const MORE: &str = "… and more: 1000 shown; use --limit or --state";

async fn state_and_limit_in_the_database(b: Backend) {
    let h = harness(b).await;
    let q = "AQUSER.RAW_QUE";
    send(&h, q, 1_050, "<correlation>R{i}</correlation>").await;
    send(&h, q, 1, "<correlation>W1</correlation><delay>3600</delay>").await;

    // The WAIT message comes after more READY ones than shown: the filter finds it, even
    // when one row is asked for.
    for limit in [None, Some("1")] {
        let args: Vec<&str> =
            ["--state", "WAIT"].into_iter().chain(limit.map(|l| ["--limit", l]).into_iter().flatten()).collect();
        let (table, _) = ok(&admin_messages(&h.url, q, &args));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2, "a header and the WAIT row: {table}");
        assert!(lines[1].contains("WAIT") && lines[1].ends_with(" W1"), "{table}");
    }
    let (json, note) = ok(&admin_messages(&h.url, q, &["--state", "wait", "--json"]));
    assert_eq!((corr_ids(&json), note.as_str()), (vec!["W1".to_string()], ""));

    // 1,051 rows: the default shows 1,000, in enqueue order, and says there are more.
    let (table, _) = ok(&admin_messages(&h.url, q, &[]));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 1 + 1_000 + 1, "header, rows, note");
    assert!(lines[1].ends_with(" R0") && lines[1_000].ends_with(" R999"), "{}\n{}", lines[1], lines[1_000]);
    assert_eq!(lines[1_001], MORE);
    let (json, note) = ok(&admin_messages(&h.url, q, &["--json"]));
    assert_eq!(corr_ids(&json).len(), 1_000);
    assert_eq!(note.trim_end(), MORE, "with --json, the note goes to standard error");
    // Enough room: every row, no note.
    let (json, note) = ok(&admin_messages(&h.url, q, &["--json", "--limit", "1051"]));
    assert_eq!((corr_ids(&json).len(), note.as_str()), (1_051, ""));
    assert_eq!(corr_ids(&json).last().map(String::as_str), Some("W1"));
    let (table, _) = ok(&admin_messages(&h.url, q, &["--state", "READY", "--limit", "1050"]));
    assert_eq!(
        table.lines().count(),
        1 + 1_050,
        "exactly the READY ones, no note: {}",
        table.lines().last().unwrap_or("")
    );
    let (table, _) = ok(&admin_messages(&h.url, q, &["--state", "READY", "--limit", "1049"]));
    assert_eq!(table.lines().last(), Some("… and more: 1049 shown; use --limit or --state"));

    // The bound.
    for bad in ["0", "100001", "-5"] {
        let out = admin_messages(&h.url, q, &[&format!("--limit={bad}")]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains("--limit") && said.contains("100000"), "--limit {bad}: {said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_and_limit_apply_in_the_database_on_sqlite() {
    state_and_limit_in_the_database(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_and_limit_apply_in_the_database_on_postgres() {
    state_and_limit_in_the_database(Backend::Postgres).await;
}

/// An AQXmlPublish to AQUSER.EMP_TOPIC of `n` messages, each for APP1, APP2 and APP3.
fn publish(from: usize, n: usize) -> String {
    let mut set = format!("<message_count>{n}</message_count>");
    for i in 0..n {
        set.push_str(&format!(
            "<message><message_number>{}</message_number><message_header><correlation>P{}</correlation><recipient_list><recipient><agent_name>APP1</agent_name></recipient><recipient><agent_name>APP2</agent_name></recipient><recipient><agent_name>APP3</agent_name></recipient></recipient_list></message_header><message_payload><EMP_TYP><EMPNO>1</EMPNO><ENAME>X</ENAME><JOB>Y</JOB><MGR>2</MGR><HIREDATE>2024-01-01 0:0:0</HIREDATE><SAL>1</SAL><COMM>0</COMM><DEPTNO>10</DEPTNO></EMP_TYP></message_payload></message>",
            i + 1,
            from + i
        ));
    }
    envelope(&format!(
        r#"<AQXmlPublish xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>AQUSER.EMP_TOPIC</destination></producer_options><message_set>{set}</message_set>{COMMIT}</AQXmlPublish>"#
    ))
}

/// PostgreSQL without statistics (a fresh database, never analyzed) estimates every
/// filter as selective and plans nested loops: the query `admin messages` runs must then
/// find the queue's messages, their deliveries and the kept ones through indexes, not scan
/// a table once, or once per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_is_planned_on_indexes_without_statistics_on_postgres() {
    use aqgate_store::views;
    use sqlx::Connection;
    let h = harness(Backend::Postgres).await;
    let mut s = h.session("JOHN");
    for from in (0..2_000).step_by(250) {
        h.run(&mut s, &publish(from, 250)).await.expect("publish");
    }
    let (table, _) = ok(&admin_messages(&h.url, "AQUSER.EMP_TOPIC", &["--limit", "6000"]));
    assert_eq!(table.lines().count(), 1 + 6_000, "a row per message and consumer");

    let mut c = sqlx::PgConnection::connect(&h.url).await.expect("connect");
    let qid: i64 = sqlx::query_scalar("SELECT id FROM queues WHERE name = 'AQUSER.EMP_TOPIC'")
        .fetch_one(&mut c)
        .await
        .expect("queue id");
    for state in [None, Some("READY"), Some("WAIT"), Some("PROCESSED")] {
        // The page's messages, in dequeue order, from the index (no sort of the queue).
        for (single, index) in [(true, "messages_single_order"), (false, "messages_multi_order")] {
            let sql =
                format!("EXPLAIN {}", views::candidates_sql(views::Dialect::Postgres, state, single, "", "1 = 1"));
            let plan = sqlx::query_scalar::<_, String>(&sql)
                .bind(qid)
                .bind(i64::MIN)
                .bind(i64::MIN)
                .bind(1_001_i64)
                .fetch_all(&mut c)
                .await
                .expect("explain")
                .join("\n");
            assert!(plan.contains(index), "{state:?}:\n{plan}");
            assert!(!plan.contains("Seq Scan on messages") && !plan.contains("Sort Key"), "{state:?}: a sort:\n{plan}");
        }
        // Their rows, by primary keys (a page's few messages of a larger queue: here 10 of
        // its 2,000, where all of them would be cheaper to read whole).
        let sql = format!("EXPLAIN {}", views::listing_sql(views::Dialect::Postgres, state.is_some(), ""));
        let seqs: Vec<i64> = (1..=10).collect();
        let mut q = sqlx::query_scalar::<_, String>(&sql).bind(&seqs).bind(&seqs).bind(qid).bind(true);
        if let Some(st) = state {
            q = q.bind(st);
        }
        let plan = q.fetch_all(&mut c).await.expect("explain").join("\n");
        // (The fixture keeps no messages and has no dequeue history: those tables, empty,
        // are cheapest read whole.)
        for table in ["messages", "deliveries"] {
            assert!(!plan.contains(&format!("Seq Scan on {table} ")), "{state:?}: a scan of {table}:\n{plan}");
        }
        assert!(!plan.contains("deliveries_order"), "{state:?}: deliveries by queue alone, per message:\n{plan}");
    }
}

/// An `AQ$` view's `msg_id` is the hex text of the stored id: aqgate keeps no index on that
/// text (it would cost every send), and docs/operations.md gives the index an operator who
/// looks messages up by `msg_id` in the views of deep queues adds. That index serves the
/// views' lookup, on a fresh database without statistics as on an analyzed one, and the
/// lookup finds the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_msg_id_index_serves_a_views_lookup_on_postgres() {
    use sqlx::Connection;
    let h = harness(Backend::Postgres).await;
    send(&h, "AQUSER.RAW_QUE", 10_000, "<correlation>R{i}</correlation>").await;
    let mut c = sqlx::PgConnection::connect(&h.url).await.expect("connect");
    let (id, corr): (String, String) =
        sqlx::query_as("SELECT upper(encode(msgid, 'hex')), corrid FROM messages WHERE corrid = 'R1234'")
            .fetch_one(&mut c)
            .await
            .expect("a message");
    let view = r#""AQUSER.AQ$RAW_TAB""#;
    let plan = || async {
        sqlx::query_scalar::<_, String>(&format!("EXPLAIN SELECT msg_state FROM {view} WHERE msg_id = $1"))
            .bind(&id)
            .fetch_all(&mut sqlx::PgConnection::connect(&h.url).await.expect("connect"))
            .await
            .expect("explain")
            .join("\n")
    };
    let before = plan().await;
    assert!(!before.contains("messages_msgid_hex"), "no such index until the operator adds it:\n{before}");
    // As docs/operations.md ("Deep queues") gives it.
    sqlx::query("CREATE INDEX messages_msgid_hex ON messages (upper(encode(msgid, 'hex')))")
        .execute(&mut c)
        .await
        .expect("the documented index");
    for analyzed in [false, true] {
        if analyzed {
            sqlx::query("ANALYZE messages").execute(&mut c).await.expect("analyze");
        }
        // The id as a user writes it, in either case.
        for asked in [id.clone(), id.to_lowercase()] {
            let found: Vec<(String, String)> =
                sqlx::query_as(&format!("SELECT msg_id, corr_id FROM {view} WHERE msg_id = upper($1)"))
                    .bind(&asked)
                    .fetch_all(&mut c)
                    .await
                    .expect("lookup");
            assert_eq!(found, vec![(id.clone(), corr.clone())], "analyzed={analyzed}");
        }
        let plan = plan().await;
        assert!(plan.contains("messages_msgid_hex"), "analyzed={analyzed}:\n{plan}");
        assert!(!plan.contains("Seq Scan on messages"), "analyzed={analyzed}: a scan:\n{plan}");
    }
}
