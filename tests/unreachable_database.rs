//! A database that cannot be reached, through the real binary: the command ends at once,
//! saying what it tried (the URL, without its password) and why it failed.

use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_aqgate");

/// Runs `aqgate ARGS` without the caller's `AQGATE_*` variables: (success, stderr, time taken).
fn aqgate(args: &[&str]) -> (bool, String, Duration) {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("AQGATE_") {
            c.env_remove(k);
        }
    }
    let t = Instant::now();
    let out = c.args(args).output().expect("run aqgate");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned(), t.elapsed())
}

/// A free port on 127.0.0.1 (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// Nothing listens on port 1 (only root could bind it): the connection is refused.
#[test]
fn serve_on_an_unreachable_postgres_says_what_it_tried_and_why() {
    let listen = format!("127.0.0.1:{}", free_port());
    let url = "postgres://postgres@127.0.0.1:1/x";
    let (ok, err, took) = aqgate(&["serve", "--no-smtp", "--listen", &listen, "--database", url]);
    assert!(!ok, "{err}");
    assert!(err.contains("cannot connect to postgres://postgres@127.0.0.1:1/x: connection refused"), "{err}");
    assert_eq!(err.matches("refused").count(), 1, "said once: {err}");
    assert!(!err.contains("timed out"), "{err}");
    assert!(took < Duration::from_secs(10), "at once, not after the pool's timeout: {took:?}");
}

#[test]
fn the_password_in_the_url_is_not_shown() {
    let url = "postgres://postgres:hunter2@127.0.0.1:1/x?sslmode=disable";
    let (ok, err, took) = aqgate(&["admin", "queues", "--database", url]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("cannot connect to postgres://postgres:***@127.0.0.1:1/x?sslmode=disable: connection refused"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// SQLite: a file that cannot be made is named too.
#[test]
fn a_sqlite_file_that_cannot_be_opened_is_named() {
    let dir = std::env::temp_dir().join(format!("aqgate-no-such-dir-{}", free_port()));
    let url = format!("sqlite://{}/aqgate.db", dir.display());
    let (ok, err, _) = aqgate(&["admin", "queues", "--database", &url]);
    assert!(!ok, "{err}");
    assert!(err.contains(&format!("cannot open {url}: ")), "{err}");
}
