//! Removing Messaging Gateway jobs through a real `aqgate serve` and real brokers (NATS with
//! JetStream, RabbitMQ and Mosquitto on the machine; a private NATS for the test that kills
//! it): a non-forced removal ends an inbound job's durable consumer, persistent session or
//! RabbitMQ topic queue before its status goes, and its marks with it, whether a node runs
//! at the removal (SIGHUP or not) or only starts later (DELETE_PENDING meanwhile, on SQLite
//! and PostgreSQL); `serve --topology` does not bring back a job removed with `--remove`,
//! `admin apply` does; while the broker is down the job stays DELETE_PENDING with the error,
//! and `--force` takes it at once, leaving the broker as it is; a forced removal of a
//! running job stops it without a SIGHUP (the node sees the change); an outbound job forgets its
//! doubts about messages no longer in its source.

mod common;

use std::time::{Duration, Instant};

use common::brokers::Broker;
use common::gateway::*;
use common::*;

/// `aqgate serve` as [`serve`] does, with a lease of 3 s (a heartbeat every second).
fn serve_quick(what: &str, db: &str, port: u16, topology: &std::path::Path) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        &format!("aqgate serve ({what})"),
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db])
            .args(["--topology", topology.to_str().expect("utf-8")])
            .env("AQGATE_PROPAGATION_LEASE_TTL", "3"),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// `aqgate admin jobs ARGS` on `db`: whether it succeeded, and what it printed.
fn admin_jobs(db: &str, args: &[&str]) -> (bool, String) {
    let out = aqgate(&["admin", "jobs", "--database", db]).args(args).output().expect("admin jobs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Waits until job `name` is no longer listed, then asserts it stays away for `stays`.
fn wait_gone(db: &str, name: &str, within: Duration, stays: Duration) {
    wait_until(&format!("job {name} gone from admin jobs"), within, || !jobs(db).contains_key(name));
    let until = Instant::now() + stays;
    while Instant::now() < until {
        let all = jobs(db);
        assert!(!all.contains_key(name), "job {name} came back: {all:#?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Rows of `table` (`gateway_seen` or `gateway_doubt`) for job `name`.
async fn gateway_rows(db: &str, table: &str, name: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(db).await.expect("connect");
    let agent = aqgate_core::topology::propagation::job_agent(name);
    sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table} WHERE job = $1"))
        .bind(agent)
        .fetch_one(&mut c)
        .await
        .expect("count")
}

/// Whether `stream` holds the durable consumer `durable` (no such stream: it does not).
async fn consumer_exists(js: &async_nats::jetstream::Context, stream: &str, durable: &str) -> bool {
    let s = match js.get_stream(stream).await {
        Ok(s) => s,
        Err(e) if e.to_string().contains("not found") => return false,
        Err(e) => panic!("stream {stream}: {e}"),
    };
    match s.consumer_info(durable).await {
        Ok(_) => true,
        Err(e) if e.to_string().contains("not found") => false,
        Err(e) => panic!("consumer info {durable}: {e}"),
    }
}

/// Publishes `n` messages to `subject`, each acknowledged by the stream.
async fn publish(js: &async_nats::jetstream::Context, subject: &str, n: usize) {
    for i in 0..n {
        let ack = js.publish(subject.to_string(), format!("{i:04}").into_bytes().into()).await.expect("publish");
        ack.await.expect("PubAck");
    }
}

/// NATS on the machine. Stale doubts: an outbound job's doubts about ids no longer in its
/// source (one not there, one not an AQ id) count in `admin jobs` until the job starts,
/// then go. Non-forced removal of the inbound job: after SIGHUP its durable consumer and its
/// marks are gone, and the outbound job goes on. Forced removal of the outbound job with no
/// SIGHUP: it stops within a few heartbeats and is not taken again; its messages wait.
#[tokio::test(flavor = "multi_thread")]
async fn nats_removal_ends_the_consumer_and_forgets_doubts() {
    let t = tag();
    let stream = format!("AQGT_{}", t.to_uppercase());
    let subject = format!("aqgt.{t}.orders");
    let topo = nats_topology("gateway-removal-nats", "nats://127.0.0.1:4222", "", &subject, &stream);
    let db = fresh_pg_url().await;
    let port = free_port();
    let js = jetstream(4222).await;

    let s = serve_quick("removal", &db, port, &topo);
    wait_job(&db, "FROM_NATS", Duration::from_secs(30), |j| j["state"] == "RUNNING");
    wait_job(&db, "TO_NATS", Duration::from_secs(30), |j| j["state"] == "RUNNING");
    s.kill9();
    {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&db).await.expect("connect");
        let agent = aqgate_core::topology::propagation::job_agent("TO_NATS");
        for id in ["0123456789ABCDEF0123456789ABCDEF", "not-an-aq-id"] {
            sqlx::query("INSERT INTO gateway_doubt (job, message_id, since) VALUES ($1, $2, 1)")
                .bind(&agent)
                .bind(id)
                .execute(&mut c)
                .await
                .expect("insert doubt");
        }
    }
    assert_eq!(job(&admin_json(&db, "jobs"), "TO_NATS")["in_doubt"], 2, "stale doubts count until the job starts");
    let s = serve_quick("removal", &db, port, &topo);
    wait_job(&db, "TO_NATS", Duration::from_secs(30), |j| j["in_doubt"] == 0 && j["state"] == "RUNNING");
    assert!(s.log().contains("forgot doubts about messages gone from the source"), "{}", s.log_tail(20));

    // Inbound traffic, so that the job has marks and its consumer acknowledgements.
    publish(&js, &subject, 5).await;
    // The outbound job sends them back to the stream: what it publishes, the inbound job
    // takes too; wait for a quiet RAW_ARCHIVE holding each.
    send_numbered(port, "AQUSER.RAW_QUE", 0, 3, 3, "").await;
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 8, Duration::from_secs(30));
    assert!(consumer_exists(&js, &stream, "aqgate_FROM_NATS").await);
    assert!(gateway_rows(&db, "gateway_seen", "FROM_NATS").await >= 8);

    let (ok, said) = admin_jobs(&db, &["--remove", "from_nats"]);
    assert!(ok, "{said}");
    assert!(said.contains("removed from the stored topology") && said.contains("DELETE_PENDING"), "{said}");
    s.signal("-HUP");
    wait_gone(&db, "FROM_NATS", Duration::from_secs(30), Duration::from_secs(3));
    assert!(!consumer_exists(&js, &stream, "aqgate_FROM_NATS").await, "the durable consumer is gone");
    assert_eq!(gateway_rows(&db, "gateway_seen", "FROM_NATS").await, 0, "its marks are gone");
    let before = stream_messages(&js, &stream).await;
    send_numbered(port, "AQUSER.RAW_QUE", 10, 2, 2, "").await;
    wait_until("the outbound job goes on", Duration::from_secs(30), || depth(&db, "AQUSER.RAW_QUE") == 0);
    let after = stream_messages(&js, &stream).await;
    assert_eq!(after, before + 2, "two more in the stream");

    // Forced, and no SIGHUP: the running node sees the change in the store and stops the job.
    let (ok, said) = admin_jobs(&db, &["--remove", "TO_NATS", "--force"]);
    assert!(ok, "{said}");
    assert!(said.contains("status deleted"), "{said}");
    wait_gone(&db, "TO_NATS", Duration::from_secs(15), Duration::from_secs(4));
    send_numbered(port, "AQUSER.RAW_QUE", 20, 2, 2, "").await;
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(depth(&db, "AQUSER.RAW_QUE"), 2, "nothing takes the removed job's messages");
    assert_eq!(stream_messages(&js, &stream).await, after);
    assert!(s.log().contains("the stored topology changed: reloading it"), "{}", s.log_tail(20));

    let (ok, said) = admin_jobs(&db, &["--remove", "TO_NATS"]);
    assert!(!ok && said.contains("no propagation job TO_NATS"), "{said}");
    drop(s);
    let _ = js.delete_stream(&stream).await;
    let _ = std::fs::remove_file(&topo);
}

/// Whether the MQTT broker on 127.0.0.1:`port` holds a session for `client_id`: connects
/// taking it up (clean start off) with `expiry` seconds of session expiry, and disconnects.
async fn mqtt_session_present(port: u16, client_id: &str, expiry: u32) -> bool {
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};
    let mut o = MqttOptions::new(client_id, "127.0.0.1", port);
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(expiry));
    let (c, mut el) = AsyncClient::new(o, 100);
    let present = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match el.poll().await.expect("MQTT") {
                Event::Incoming(Packet::ConnAck(a)) => return a.session_present,
                _ => continue,
            }
        }
    })
    .await
    .expect("CONNACK");
    c.disconnect().await.expect("disconnect");
    while let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), el.poll()).await {}
    present
}

/// Mosquitto on the machine: the inbound job keeps a persistent session while it exists
/// (seen while aqgate is down); removed (then SIGHUP), the session is gone.
#[tokio::test(flavor = "multi_thread")]
async fn mqtt_removal_ends_the_persistent_session() {
    let t = tag();
    let (tout, tin) = (format!("aqgt/{t}/out"), format!("aqgt/{t}/in"));
    let topo = mqtt_topology("gateway-removal-mqtt", "mqtt://127.0.0.1:1883", "", &tout, &tin, &t);
    let db = fresh_pg_url().await;
    let port = free_port();
    let name = format!("FROM_MQTT_{}", t.to_uppercase());
    let client_id = format!("aqgate-{name}");

    let s = serve_quick("removal", &db, port, &topo);
    wait_job(&db, &name, Duration::from_secs(30), |j| j["state"] == "RUNNING");
    s.kill9();
    assert!(mqtt_session_present(1883, &client_id, 600).await, "the job's session outlives its process");
    let s = serve_quick("removal", &db, port, &topo);
    wait_job(&db, &name, Duration::from_secs(30), |j| j["state"] == "RUNNING");

    let (ok, said) = admin_jobs(&db, &["--remove", &name]);
    assert!(ok, "{said}");
    s.signal("-HUP");
    wait_gone(&db, &name, Duration::from_secs(30), Duration::from_secs(3));
    assert!(s.log().contains("the removed job's state at its broker is gone"), "{}", s.log_tail(20));
    assert!(!mqtt_session_present(1883, &client_id, 0).await, "the session is gone");
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

/// A private NATS, killed: the removed inbound job stays DELETE_PENDING with the error
/// while it cannot end its consumer; `--force` takes it at once and for good, and the
/// consumer is left at the server (as the answer says of a forced removal).
#[tokio::test(flavor = "multi_thread")]
async fn removal_waits_for_a_dead_broker_and_force_ends_it() {
    let t = tag();
    let stream = format!("AQGT_{}", t.to_uppercase());
    let subject = format!("aqgt.{t}.orders");
    let mut nats = Broker::nats();
    let url = format!("nats://127.0.0.1:{}", nats.port);
    let topo = nats_topology("gateway-removal-dead", &url, QUICK_RECONNECT, &subject, &stream);
    let db = fresh_pg_url().await;
    let port = free_port();
    let s = serve_quick("removal", &db, port, &topo);
    wait_job(&db, "FROM_NATS", Duration::from_secs(30), |j| j["state"] == "RUNNING");
    // A job is RUNNING from its start, before it has reached the broker: wait for what it
    // makes there (its stream and durable consumer), or the kill may come first.
    wait_consumer(&jetstream(nats.port).await, &stream, "aqgate_FROM_NATS", true).await;

    nats.kill9();
    let (ok, said) = admin_jobs(&db, &["--remove", "FROM_NATS"]);
    assert!(ok, "{said}");
    s.signal("-HUP");
    let j = wait_job(&db, "FROM_NATS", Duration::from_secs(30), |j| {
        j["state"] == "DELETE_PENDING" && j["last_error"].as_str().is_some_and(|e| e.contains("removing the job"))
    });
    println!("while NATS is down: {j}");
    // Still there two leases later: the holder renews it while it retries.
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(jobs(&db)["FROM_NATS"]["state"], "DELETE_PENDING");

    let (ok, said) = admin_jobs(&db, &["--remove", "FROM_NATS"]);
    assert!(!ok && said.contains("--force"), "only --force removes what is left: {said}");
    let (ok, said) = admin_jobs(&db, &["--remove", "FROM_NATS", "--force"]);
    assert!(ok && said.contains("status deleted"), "{said}");
    wait_gone(&db, "FROM_NATS", Duration::from_secs(1), Duration::from_secs(5));
    wait_until("the holder stops retrying", Duration::from_secs(15), || {
        s.log().contains("the job's removal is no longer pending (forced")
    });

    nats.start();
    let js = jetstream(nats.port).await;
    assert!(consumer_exists(&js, &stream, "aqgate_FROM_NATS").await, "a forced removal leaves the broker as it is");
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

/// Waits until the durable consumer `durable` of `stream` exists (or, `want` false, does not).
async fn wait_consumer(js: &async_nats::jetstream::Context, stream: &str, durable: &str, want: bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while consumer_exists(js, stream, durable).await != want {
        assert!(Instant::now() < deadline, "consumer {durable} exists: {} after 30 s", !want);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Stops `s` with SIGTERM, as an operator would: it gives its leases up.
fn stop(mut s: Proc) {
    s.signal("-TERM");
    assert!(s.wait_exit(Duration::from_secs(30)).success(), "{}", s.log_tail(20));
}

/// No node running: `--remove` leaves the inbound job DELETE_PENDING in `admin jobs` and its
/// durable consumer at NATS. The next node, started with the same topology file (which
/// still names the job), does not re-create the job, ends the consumer, and the row goes.
/// `admin apply` of the file re-creates it, and the running node takes it up on SIGHUP;
/// removed again with no SIGHUP, the running node stops it and ends its consumer.
async fn removal_while_no_node_runs(b: Backend) {
    let t = tag();
    let stream = format!("AQGT_{}", t.to_uppercase());
    let subject = format!("aqgt.{t}.orders");
    let topo = nats_topology("gateway-removal-offline", "nats://127.0.0.1:4222", "", &subject, &stream);
    let db = fresh_url(b).await;
    let port = free_port();
    let js = jetstream(4222).await;
    let s = serve_quick("offline removal", &db, port, &topo);
    wait_job(&db, "FROM_NATS", Duration::from_secs(30), |j| j["state"] == "RUNNING");
    wait_consumer(&js, &stream, "aqgate_FROM_NATS", true).await;
    stop(s);

    let (ok, said) = admin_jobs(&db, &["--remove", "from_nats"]);
    assert!(ok && said.contains("DELETE_PENDING"), "{said}");
    let j = jobs(&db).remove("FROM_NATS").expect("a DELETE_PENDING row");
    assert_eq!((j["state"].as_str(), j["owner"].is_null()), (Some("DELETE_PENDING"), true), "{j}");
    assert_eq!(j["source"], "ORDERS@NATS", "{j}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(consumer_exists(&js, &stream, "aqgate_FROM_NATS").await, "no node: the consumer stays");
    assert_eq!(jobs(&db)["FROM_NATS"]["state"], "DELETE_PENDING");
    let (ok, said) = admin_jobs(&db, &["--remove", "FROM_NATS"]);
    assert!(!ok && said.contains("DELETE_PENDING already"), "{said}");
    let text = aqgate(&["admin", "jobs", "--database", &db]).output().expect("admin jobs");
    assert!(String::from_utf8_lossy(&text.stdout).contains("DELETE_PENDING"), "the table says it too");

    let s = serve_quick("offline removal", &db, port, &topo);
    wait_gone(&db, "FROM_NATS", Duration::from_secs(30), Duration::from_secs(3));
    assert!(!consumer_exists(&js, &stream, "aqgate_FROM_NATS").await, "the next node ended the consumer");
    assert!(s.log().contains("not re-created"), "{}", s.log_tail(20));
    assert_eq!(jobs(&db)["TO_NATS"]["state"], "RUNNING");

    let out = aqgate(&["admin", "apply", topo.to_str().expect("utf-8"), "--database", &db]).output().expect("apply");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("+ gateway_job FROM_NATS"), "{said}");
    s.signal("-HUP");
    wait_job(&db, "FROM_NATS", Duration::from_secs(30), |j| j["state"] == "RUNNING");
    wait_consumer(&js, &stream, "aqgate_FROM_NATS", true).await;

    // Removed while the node runs it, and no SIGHUP: the node sees the change in the store,
    // stops the job and ends its consumer.
    let (ok, said) = admin_jobs(&db, &["--remove", "FROM_NATS"]);
    assert!(ok, "{said}");
    wait_gone(&db, "FROM_NATS", Duration::from_secs(30), Duration::from_secs(3));
    wait_consumer(&js, &stream, "aqgate_FROM_NATS", false).await;
    assert!(s.log().contains("the stored topology changed: reloading it"), "{}", s.log_tail(20));
    drop(s);
    let _ = js.delete_stream(&stream).await;
    let _ = std::fs::remove_file(&topo);
}

#[tokio::test(flavor = "multi_thread")]
async fn removal_while_no_node_runs_sqlite() {
    removal_while_no_node_runs(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn removal_while_no_node_runs_postgres() {
    removal_while_no_node_runs(Backend::Postgres).await;
}

/// Whether RabbitMQ on the machine has queue `q` (a passive declaration on a channel of its own).
async fn rabbit_queue_exists(q: &str) -> bool {
    use lapin::options::QueueDeclareOptions;
    let ch = rabbit().await;
    let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
    ch.queue_declare(q.into(), passive, lapin::types::FieldTable::default()).await.is_ok()
}

/// RabbitMQ on the machine, an inbound job on a topic (an exchange): the job's own queue
/// `aqgate.<job>`, bound to the exchange, exists while the job does; removed (no SIGHUP),
/// the running node deletes it; the exchange, declared for the foreign queue, stays.
#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_topic_removal_deletes_the_jobs_queue() {
    let t = tag();
    let exchange = format!("aqgt.{t}.x");
    let toml = format!(
        "\n[[gateway.links]]\nname = \"rabbit\"\nkind = \"rabbitmq\"\nurl = \"amqp://127.0.0.1:5672/%2f\"\n\
         username = \"guest\"\npassword_env = \"AQGT_RABBIT_PASSWORD\"\n\
         \n[[gateway.foreign_queues]]\nname = \"x\"\nlink = \"rabbit\"\nnative_name = \"{exchange}\"\n\
         domain = \"topic\"\nrouting_key = \"#\"\ncreate = true\n\
         \n[[gateway.jobs]]\nname = \"from_x_{t}\"\nsource = \"x@rabbit\"\ndestination = \"AQUSER.RAW_ARCHIVE\"\n"
    );
    let topo = demo_topology_with("gateway-removal-topic", &toml);
    let db = fresh_pg_url().await;
    let port = free_port();
    let name = format!("FROM_X_{}", t.to_uppercase());
    let listen = format!("127.0.0.1:{port}");
    let mut s = Proc::spawn(
        "aqgate serve (topic removal)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", &db])
            .args(["--topology", topo.to_str().expect("utf-8")])
            .env("AQGATE_PROPAGATION_LEASE_TTL", "3")
            .env("AQGT_RABBIT_PASSWORD", "guest"),
    );
    s.wait_ready(port, Duration::from_secs(60));
    wait_job(&db, &name, Duration::from_secs(30), |j| j["state"] == "RUNNING");
    let queue = format!("aqgate.{name}");
    // RUNNING is reported once the lease is taken; the job declares its queue when it has
    // connected, a moment later on a loaded machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !rabbit_queue_exists(&queue).await && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(rabbit_queue_exists(&queue).await, "the job's own queue exists");

    let (ok, said) = admin_jobs(&db, &["--remove", &name]);
    assert!(ok && said.contains("DELETE_PENDING"), "{said}");
    wait_gone(&db, &name, Duration::from_secs(30), Duration::from_secs(3));
    assert!(!rabbit_queue_exists(&queue).await, "the job's queue is gone");
    assert!(s.log().contains(&format!("queue {queue} and its binding")), "{}", s.log_tail(20));
    let ch = rabbit().await;
    let passive = lapin::options::ExchangeDeclareOptions { passive: true, ..Default::default() };
    ch.exchange_declare(exchange.as_str().into(), lapin::ExchangeKind::Topic, passive, Default::default())
        .await
        .expect("the exchange stays");
    let _ = ch.exchange_delete(exchange.as_str().into(), Default::default()).await;
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

/// A job taken out of the topology file by `admin apply` while no node runs is
/// DELETE_PENDING too, and ended by the next node started with that file; it leaves no
/// tombstone, so a file naming it again brings it back. A forced removal leaves one (the
/// file does not bring the job back) and leaves the consumer at NATS, as its answer says.
#[tokio::test(flavor = "multi_thread")]
async fn apply_removal_is_pending_and_force_leaves_the_consumer() {
    let t = tag();
    let stream = format!("AQGT_{}", t.to_uppercase());
    let subject = format!("aqgt.{t}.orders");
    let both = nats_topology("gateway-removal-apply", "nats://127.0.0.1:4222", "", &subject, &stream);
    let toml = format!(
        "\n[[gateway.links]]\nname = \"nats\"\nkind = \"nats\"\nurl = \"nats://127.0.0.1:4222\"\n\
         \n[[gateway.foreign_queues]]\nname = \"orders\"\nlink = \"nats\"\nnative_name = \"{subject}\"\n\
         stream = \"{stream}\"\ncreate = true\n\
         \n[[gateway.jobs]]\nname = \"to_nats\"\nsource = \"AQUSER.RAW_QUE\"\ndestination = \"orders@nats\"\nbatch_size = 20\n"
    );
    let outbound_only = demo_topology_with("gateway-removal-apply-out", &toml);
    let db = fresh_pg_url().await;
    let port = free_port();
    let js = jetstream(4222).await;
    let s = serve_quick("apply removal", &db, port, &both);
    wait_job(&db, "FROM_NATS", Duration::from_secs(30), |j| j["state"] == "RUNNING");
    wait_consumer(&js, &stream, "aqgate_FROM_NATS", true).await;
    stop(s);

    let out =
        aqgate(&["admin", "apply", outbound_only.to_str().expect("utf-8"), "--database", &db]).output().expect("apply");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("- gateway_job FROM_NATS"), "{said}");
    assert_eq!(jobs(&db)["FROM_NATS"]["state"], "DELETE_PENDING");
    assert!(consumer_exists(&js, &stream, "aqgate_FROM_NATS").await, "no node: the consumer stays");
    let s = serve_quick("apply removal", &db, port, &outbound_only);
    wait_gone(&db, "FROM_NATS", Duration::from_secs(30), Duration::from_secs(1));
    assert!(!consumer_exists(&js, &stream, "aqgate_FROM_NATS").await, "the node ended the consumer");
    stop(s);

    // No tombstone: the file that names the job brings it back.
    let s = serve_quick("apply removal", &db, port, &both);
    wait_job(&db, "FROM_NATS", Duration::from_secs(30), |j| j["state"] == "RUNNING");
    wait_consumer(&js, &stream, "aqgate_FROM_NATS", true).await;
    let (ok, said) = admin_jobs(&db, &["--remove", "FROM_NATS", "--force"]);
    assert!(ok && said.contains("left at the broker") && said.contains("aqgate_FROM_NATS"), "{said}");
    wait_gone(&db, "FROM_NATS", Duration::from_secs(15), Duration::from_secs(1));
    stop(s);
    let s = serve_quick("apply removal", &db, port, &both);
    wait_job(&db, "TO_NATS", Duration::from_secs(30), |j| j["state"] == "RUNNING");
    assert!(!jobs(&db).contains_key("FROM_NATS"), "the forced removal's tombstone keeps it out");
    assert!(s.log().contains("not re-created"), "{}", s.log_tail(20));
    assert!(consumer_exists(&js, &stream, "aqgate_FROM_NATS").await, "a forced removal leaves the consumer");
    drop(s);
    let _ = js.delete_stream(&stream).await;
    for f in [both, outbound_only] {
        let _ = std::fs::remove_file(f);
    }
}
