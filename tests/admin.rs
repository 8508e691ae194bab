//! `aqgate admin …` tables through the real binary: what they print.

mod common;

use std::process::Command;

use common::fresh_sqlite_url;

const BIN: &str = env!("CARGO_BIN_EXE_aqgate");
const TOPOLOGY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/topology.toml");

fn admin(args: &[&str]) -> String {
    let out = Command::new(BIN).arg("admin").args(args).env_remove("AQGATE_CONFIG").output().expect("run admin");
    assert!(out.status.success(), "admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `admin queues` names payload types as the topology file spells them (the schema of an
/// object type aside), not as the program holds them.
#[test]
fn admin_queues_prints_payload_types_as_the_topology_spells_them() {
    let db = fresh_sqlite_url();
    admin(&["apply", TOPOLOGY, "--database", &db]);
    let listing = admin(&["queues", "--database", &db]);
    let payload_of = |queue: &str| -> String {
        let line = listing
            .lines()
            .find(|l| l.split_whitespace().next() == Some(queue))
            .unwrap_or_else(|| panic!("{queue} not listed in:\n{listing}"));
        line.split_whitespace().nth(2).unwrap_or_default().to_string()
    };
    for (queue, payload) in [
        ("QS.NEW_ORDERS_QUE", "ORDER_TYP"),
        ("AQUSER.EMP_TOPIC", "EMP_TYP"),
        ("AQUSER.RAW_QUE", "RAW"),
        ("AQUSER.JMS_TEXTQ", "SYS.AQ$_JMS_TEXT_MESSAGE"),
        ("AQUSER.JMS_MAPQ", "SYS.AQ$_JMS_MAP_MESSAGE"),
        ("AQUSER.XML_QUE", "SYS.XMLTYPE"),
        ("QS.AQ$_ORDERS_SQTAB_E", "ORDER_TYP"),
    ] {
        assert_eq!(payload_of(queue), payload, "{queue} in:\n{listing}");
    }
    let header = listing.lines().next().unwrap_or_default();
    assert_eq!(header.split_whitespace().collect::<Vec<_>>(), ["QUEUE", "KIND", "PAYLOAD", "DEPTH"]);
    for l in listing.lines().skip(1) {
        assert!(!l.contains(['(', '"']), "a program's spelling: {l}");
        assert_eq!(l.split_whitespace().count(), 4, "four columns: {l}");
    }
}

/// `admin apply` refuses local propagation jobs that form a loop, naming the jobs and the
/// queues, and changes nothing.
#[test]
fn admin_apply_refuses_a_loop_of_propagation_jobs() {
    let db = fresh_sqlite_url();
    let demo = std::fs::read_to_string(TOPOLOGY).expect("topology");
    let file = std::env::temp_dir().join(format!("aqgate-test-loop-{}.toml", std::process::id()));
    std::fs::write(
        &file,
        format!(
            r#"{demo}
[[queues]]
name = "AQUSER.RAW_B"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "there"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.RAW_B"

[[propagations]]
name = "back"
source = "AQUSER.RAW_B"
destination = "AQUSER.RAW_QUE"
rule = "priority > 1"
"#
        ),
    )
    .expect("write");
    let out = Command::new(BIN)
        .args(["admin", "apply"])
        .arg(&file)
        .args(["--database", &db])
        .env_remove("AQGATE_CONFIG")
        .output()
        .expect("run");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("propagations (BACK, THERE): the jobs form a loop AQUSER.RAW_B → AQUSER.RAW_QUE → AQUSER.RAW_B"),
        "{said}"
    );
    let listing = admin(&["queues", "--database", &db]);
    assert!(!listing.contains("AQUSER.RAW_B"), "nothing applied: {listing}");
    let _ = std::fs::remove_file(&file);
}

/// What clients stored reaches `admin messages` as text in its own row and column: a
/// correlation with a newline cannot forge a row, a CR or a bidi override does not reach
/// the terminal, and a recipient name with a space does not shift the columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_messages_escapes_what_clients_stored() {
    use aqgate_proto::idap::Response;
    let db = fresh_sqlite_url();
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut serve = common::Proc::spawn(
        "aqgate serve",
        &mut common::aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", &db]),
    );
    // Ready, not only listening: the port opens before the store is migrated, and a
    // server that died meanwhile is reported with its log.
    serve.wait_ready(port, std::time::Duration::from_secs(30));
    let forged =
        "X&#10;0123456789ABCDEF0123456789ABCDEF READY 1 2026-01-01 SCOTT SCOTT 0 APP1 FORGED&#13;\u{202e}gpj.exe";
    let publish = common::envelope(&format!(
        r#"<AQXmlPublish xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>AQUSER.EMP_TOPIC</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header><correlation>{forged}</correlation><recipient_list><agent_name>APP1</agent_name><agent_name>TWO WORDS</agent_name></recipient_list></message_header><message_payload><EMP_TYP><EMPNO>1</EMPNO><ENAME>X</ENAME><JOB>Y</JOB><MGR>2</MGR><HIREDATE>2024-01-01 0:0:0</HIREDATE><SAL>1</SAL><COMM>0</COMM><DEPTNO>10</DEPTNO></EMP_TYP></message_payload></message></message_set><AQXmlCommit/></AQXmlPublish>"#
    ));
    let r = common::http(port, &publish).await;
    assert!(matches!(r, Response::Publish(..)), "{r:?}");
    let listing = admin(&["messages", "AQUSER.EMP_TOPIC", "--database", &db]);
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), 3, "a header and one row per recipient:\n{listing}");
    assert!(!listing.contains(['\r', '\u{202e}']), "{listing:?}");
    for l in &lines[1..] {
        assert!(
            l.ends_with(
                "X\\n0123456789ABCDEF0123456789ABCDEF READY 1 2026-01-01 SCOTT SCOTT 0 APP1 FORGED\\r\\u{202e}gpj.exe"
            ),
            "{l}"
        );
        // Eight columns before the correlation, whatever the names hold.
        let before = l.split_whitespace().take(8).collect::<Vec<_>>();
        assert!(before[7] == "APP1" || before[7] == "TWO\\x20WORDS", "{l}");
    }
    // The JSON form keeps the values as they are (JSON escapes them itself).
    let json: serde_json::Value =
        serde_json::from_str(&admin(&["messages", "AQUSER.EMP_TOPIC", "--database", &db, "--json"])).expect("JSON");
    assert_eq!(json[0]["CORR_ID"].as_str().map(|c| c.contains("X\n0123")), Some(true), "{json}");
}
