//! `aqgate send|receive|browse|commit|rollback` as processes against the real `aqgate
//! serve`: JSON answers, a transaction carried across invocations by `--session-file`
//! (invisible before its commit, taken back by a rollback), a fault as a non-zero exit
//! naming its code, and a wrong password refused.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// `aqgate ARGS` as scott (password `password`) against the servlet on `port`.
fn client(port: u16, password: &str, args: &[&str]) -> Output {
    aqgate(args)
        .args(["--user", "scott"])
        .env("AQGATE_URL", aqserv(port))
        .env("AQGATE_PASSWORD", password)
        .env_remove("AQGATE_CONFIG")
        .output()
        .expect("run the client")
}

/// Its JSON answer; it must have succeeded.
fn ok(port: u16, args: &[&str]) -> Value {
    let out = client(port, SCOTT.1, args);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{args:?}: {stderr}\n{stdout}");
    assert!(!stderr.contains(SCOTT.1) && !stdout.contains(SCOTT.1), "the password is never printed");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stdout}"))
}

/// The raw payloads (hex) a browse or receive answered.
fn payloads(answer: &Value) -> Vec<String> {
    answer["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["payload"]["raw_hex"].as_str().expect("a raw payload").to_string())
        .collect()
}

fn browse(port: u16) -> Vec<String> {
    payloads(&ok(port, &["browse", "AQUSER.RAW_QUE", "--json"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_commands_speak_idap_for_the_shell() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let db = fresh_sqlite_url();
    let mut server =
        Proc::spawn("aqgate serve", &mut aqgate(&["serve", "--no-smtp", "--listen", &listen, "--database", &db]));
    server.wait_ready(port, Duration::from_secs(60));
    let dir = std::env::temp_dir().join(format!("aqgate-client-cli-{port}"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let session = dir.join("session");
    let session = session.to_str().expect("utf-8 path");

    // A JMS text message, committed at once, with its header fields; received back by its
    // correlation with the text as sent (escaping both ways).
    let text = "pallet <17> & \"dock\" 3";
    let sent = ok(port, &["send", "AQUSER.JMS_TEXTQ", text, "--correlation", "dock-3", "--priority", "2", "--json"]);
    assert_eq!(sent["queue"], "AQUSER.JMS_TEXTQ");
    let id = sent["message_ids"][0].as_str().expect("a message id").to_string();
    let got = ok(port, &["receive", "AQUSER.JMS_TEXTQ", "--correlation", "dock-3", "--json"]);
    let m = &got["messages"][0];
    assert_eq!((m["message_id"].as_str(), m["payload"]["text"].as_str()), (Some(id.as_str()), Some(text)));
    assert_eq!((m["correlation"].as_str(), m["priority"].as_i64()), (Some("dock-3"), Some(2)));
    let none = ok(port, &["receive", "AQUSER.JMS_TEXTQ", "--json"]);
    assert_eq!(none["messages"], serde_json::json!([]), "nothing left: {none}");

    // A send in a session stays invisible to others until the commit of a later invocation.
    ok(port, &["send", "AQUSER.RAW_QUE", "--raw-hex", "c0ffee", "--session-file", session, "--json"]);
    assert!(Path::new(session).exists(), "the session's token is kept");
    assert!(browse(port).is_empty(), "not visible before the commit");
    assert_eq!(ok(port, &["commit", "--session-file", session, "--json"])["committed"], true);
    assert!(!Path::new(session).exists(), "the commit ended the session's transaction");
    assert_eq!(browse(port), ["C0FFEE"], "visible after the commit");

    // A receive in a session, rolled back by a later invocation: the message is back.
    let taken = ok(port, &["receive", "AQUSER.RAW_QUE", "--session-file", session, "--json"]);
    assert_eq!(payloads(&taken), ["C0FFEE"]);
    assert!(payloads(&ok(port, &["receive", "AQUSER.RAW_QUE", "--json"])).is_empty(), "locked by the session");
    assert_eq!(ok(port, &["rollback", "--session-file", session, "--json"])["rolled_back"], true);
    assert_eq!(browse(port), ["C0FFEE"], "the rollback took the receive back");

    // A fault: a non-zero exit, its code in the JSON and on stderr.
    let out = client(port, SCOTT.1, &["send", "NO.SUCH_QUEUE", "x", "--json"]);
    assert!(!out.status.success());
    let fault: Value = serde_json::from_slice(&out.stdout).expect("the fault as JSON");
    assert_eq!(fault["fault"]["code"], aqgate_core::error::code::NO_SUCH_QUEUE);
    assert!(String::from_utf8_lossy(&out.stderr).contains("fault 24010"), "{}", String::from_utf8_lossy(&out.stderr));

    // A wrong password: refused, nothing taken.
    let out = client(port, "not-tiger", &["receive", "AQUSER.RAW_QUE", "--json"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("401") && !stderr.contains("not-tiger"), "{stderr}");
    assert_eq!(browse(port), ["C0FFEE"], "the refused receive took nothing");
    let _ = std::fs::remove_dir_all(&dir);
}
