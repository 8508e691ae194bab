//! RESET_JOB through a real `aqgate serve` and RabbitMQ on the machine: an outbound job
//! whose publish the broker returns (no queue bound to the exchange for its routing key)
//! is FAILED, waiting a minute before it tries again (`retry_backoff_ms = 60000`); once a
//! queue is bound, `admin jobs --reset` makes it try again now (no SIGHUP): its failure
//! count is 0 at once, and the message arrives long before the back-off would have ended.
//! On SQLite and PostgreSQL.

mod common;

use std::time::Duration;

use common::gateway::*;
use common::*;
use lapin::options::{QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

async fn reset_makes_a_failed_job_try_again(b: Backend) {
    let t = tag();
    let exchange = format!("aqgt.{t}.x");
    let toml = format!(
        "\n[[gateway.links]]\nname = \"rabbit\"\nkind = \"rabbitmq\"\nurl = \"amqp://127.0.0.1:5672/%2f\"\n\
         username = \"guest\"\npassword_env = \"AQGT_RABBIT_PASSWORD\"\n\
         \n[[gateway.foreign_queues]]\nname = \"x\"\nlink = \"rabbit\"\nnative_name = \"{exchange}\"\n\
         domain = \"topic\"\nrouting_key = \"k\"\ncreate = true\n\
         \n[[gateway.jobs]]\nname = \"to_x\"\nsource = \"AQUSER.RAW_QUE\"\ndestination = \"x@rabbit\"\n\
         retry_backoff_ms = 60000\n"
    );
    let topo = demo_topology_with("gateway-reset", &toml);
    let db = fresh_url(b).await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut s = Proc::spawn(
        "aqgate serve (reset)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", &db])
            .args(["--topology", topo.to_str().expect("utf-8")])
            .env("AQGATE_PROPAGATION_LEASE_TTL", "3")
            .env("AQGT_RABBIT_PASSWORD", "guest"),
    );
    s.wait_ready(port, Duration::from_secs(60));
    wait_job(&db, "TO_X", Duration::from_secs(30), |j| j["state"] == "RUNNING");

    send_numbered(port, "AQUSER.RAW_QUE", 0, 1, 1, "").await;
    let j =
        wait_job(&db, "TO_X", Duration::from_secs(30), |j| j["state"] == "FAILED" && j["failed"].as_i64() >= Some(1));
    assert!(j["last_error"].as_str().is_some_and(|e| e.contains("returned")), "{j}");

    // The cause goes: a queue bound for the routing key. The job waits out its back-off.
    let ch = rabbit().await;
    let q = format!("aqgt.{t}.q");
    ch.queue_declare(q.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()).await.expect("declare");
    ch.queue_bind(
        q.as_str().into(),
        exchange.as_str().into(),
        "k".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("bind");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(depth(&db, "AQUSER.RAW_QUE"), 1, "the job is backing off");
    assert_eq!(jobs(&db)["TO_X"]["state"], "FAILED");

    let out = aqgate(&["admin", "jobs", "--database", &db, "--reset", "to_x"]).output().expect("reset");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("job to_x reset"), "{said}{}", String::from_utf8_lossy(&out.stderr));
    let j = jobs(&db).remove("TO_X").expect("TO_X");
    assert_eq!(j["failed"], 0, "the failure count is cleared: {j}");
    assert_ne!(j["state"], "FAILED", "{j}");

    // Well inside the minute of back-off the reset cut short.
    wait_until("the message left the source", Duration::from_secs(20), || depth(&db, "AQUSER.RAW_QUE") == 0);
    let got = rabbit_drain(&ch, &q).await;
    assert_eq!(got.len(), 1, "{got:?}");
    wait_job(&db, "TO_X", Duration::from_secs(15), |j| j["state"] == "RUNNING" && j["failed"] == 0);
    assert!(s.log().matches("took the job's lease").count() >= 2, "{}", s.log_tail(20));

    // A job that is not there cannot be reset.
    let out = aqgate(&["admin", "jobs", "--database", &db, "--reset", "nope"]).output().expect("reset");
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no propagation job NOPE"));
    let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
    let _ = ch.exchange_delete(exchange.as_str().into(), Default::default()).await;
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_makes_a_failed_job_try_again_sqlite() {
    reset_makes_a_failed_job_try_again(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_makes_a_failed_job_try_again_postgres() {
    reset_makes_a_failed_job_try_again(Backend::Postgres).await;
}
