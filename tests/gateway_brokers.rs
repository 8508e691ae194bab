//! The Messaging Gateway while the broker fails under it, through a real `aqgate serve` on
//! PostgreSQL: a ledger of what was lost or duplicated in each direction while the broker
//! itself is killed and started again (private instances on their own ports and data, see
//! `common::brokers`; the shared brokers are never killed), and while the TCP connection
//! to the shared brokers is cut through a proxy (`common::cutproxy`). Each test also sees
//! its link go RECONNECTING in `admin gateway` and come back CONNECTED. An outbound job's
//! window of batches (`batches_in_flight`) moves a backlog in order, and loses nothing when
//! cut in its middle. Every name at a shared broker carries a random tag, so runs do not
//! meet.

mod common;

use std::ops::Range;
use std::time::{Duration, Instant};

use common::brokers::Broker;
use common::cutproxy::CutProxy;
use common::gateway::*;
use common::*;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

/// A random moment up to `max_ms` from now.
fn moment(max_ms: u64) -> Duration {
    use std::hash::BuildHasher;
    let h = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    Duration::from_millis(h % max_ms.max(1))
}

fn in_doubt(db: &str, job: &str) -> serde_json::Value {
    self::job(&admin_json(db, "jobs"), job)["in_doubt"].clone()
}

/// What fails under the link: the broker (killed -9, or stopped gracefully where the broker
/// keeps only then what it acknowledged), or the connection to it (cut through the proxy).
enum Fault<'a> {
    Kill(&'a mut Broker),
    Stop(&'a mut Broker),
    Cut(&'a CutProxy),
}

impl Fault<'_> {
    fn down(&mut self) {
        match self {
            Fault::Kill(b) => b.kill9(),
            Fault::Stop(b) => b.stop(),
            Fault::Cut(p) => {
                // A cut that meets no connection (aqgate between two tries) proves
                // nothing: one through the proxy first. A job gives up a wait on a cut
                // connection at once, then reconnects after its backoff, each try within
                // the client's connect bound (10 s): the wait is generous for a loaded
                // machine.
                loop {
                    wait_until("a connection through the proxy", Duration::from_secs(75), || p.open() > 0);
                    p.refuse(true);
                    if p.cut() > 0 {
                        break;
                    }
                    p.refuse(false);
                }
            }
        }
    }

    fn up(&mut self) {
        match self {
            Fault::Kill(b) | Fault::Stop(b) => b.start(),
            Fault::Cut(p) => p.refuse(false),
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Fault::Kill(_) => "broker kills -9",
            Fault::Stop(_) => "broker restarts (SIGTERM)",
            Fault::Cut(_) => "cuts",
        }
    }
}

/// The traffic and the faults: in each of `rounds` rounds, `per` numbered messages go to
/// AQUSER.RAW_QUE over HTTP while `inbound` (if any) feeds the broker the same numbers,
/// and at a random moment the link fails. In the first round the link stays down until
/// `admin gateway` shows `link` RECONNECTING (a few more messages are sent meanwhile, so
/// that the outbound job tries the dead link too, and fed inbound once it is back); later
/// ones come back at once (a cut: after a random moment). With `feed_first` each round's
/// inbound feed is done before the fault. Returns the number of messages sent each way.
#[allow(clippy::too_many_arguments)]
async fn rounds<F>(
    db: &str,
    port: u16,
    link: &str,
    fault: &mut Fault<'_>,
    rounds: usize,
    per: usize,
    feed_first: bool,
    inbound: F,
) -> usize
where
    F: Fn(Range<usize>) -> tokio::task::JoinHandle<()>,
{
    let extra = 5;
    let began = Instant::now();
    let mut moments = Vec::new();
    for r in 0..rounds {
        let sender = tokio::spawn(async move { send_numbered(port, "AQUSER.RAW_QUE", r * per, per, 5, "").await });
        let mut feed = Some(inbound(r * per..(r + 1) * per));
        if feed_first && let Some(f) = feed.take() {
            f.await.expect("the inbound feed");
        }
        let m = moment(600);
        moments.push(m.as_millis());
        tokio::time::sleep(m).await;
        fault.down();
        if r == 0 {
            let from = rounds * per;
            send_numbered(port, "AQUSER.RAW_QUE", from, extra, 5, "").await;
            wait_until(&format!("{link} RECONNECTING while its broker is away"), Duration::from_secs(60), || {
                link_state(db, link).as_deref() == Some("RECONNECTING")
            });
            println!("{link} RECONNECTING after {:?}", began.elapsed());
            fault.up();
            inbound(from..from + extra).await.expect("the inbound feed");
        } else {
            if matches!(fault, Fault::Cut(_)) {
                tokio::time::sleep(moment(500)).await;
            }
            fault.up();
        }
        sender.await.expect("the sender");
        if let Some(f) = feed {
            f.await.expect("the inbound feed");
        }
    }
    println!("{} {}: at {moments:?} ms into their rounds; {:?} of rounds", rounds, fault.what(), began.elapsed());
    rounds * per + extra
}

/// Everything has arrived (see [`all_arrived`]), each of `0..total` once.
async fn settled(db: &str, port: u16, total: usize) {
    let waited = all_arrived(db, port, total, "every message through the broker", Duration::from_secs(120)).await;
    println!("all {total} arrived {waited:?} after the last fault");
}

/// Asserts none of `0..total` is missing from `copies`, nothing else is there, and every
/// copy of one beyond the first is marked; the number of duplicates.
fn assert_marked_ledger(what: &str, copies: &Copies, total: usize) -> usize {
    let lost = lost(copies, total);
    assert!(lost.is_empty(), "{what}: lost at the broker: {lost:?}");
    assert_eq!(copies.len(), total, "{what}: only the numbered messages");
    // Every copy after the first is marked (the first may be too: a publish in doubt that
    // had not arrived).
    let unmarked: Vec<_> = copies.iter().filter(|(_, (n, marked))| marked + 1 < *n).collect();
    assert!(unmarked.is_empty(), "{what}: duplicated without the mark: {unmarked:?}");
    duplicates(copies)
}

/// The cuts, each of which dropped live connections (see [`Fault::down`]).
fn assert_cut_live(proxy: &CutProxy) {
    let (cuts, accepted) = (proxy.cuts(), proxy.accepted.load(std::sync::atomic::Ordering::SeqCst));
    println!("{cuts} cuts, {accepted} connections through the proxy");
    assert!(cuts >= 8, "{cuts} cuts");
}

// ---------------------------------------------------------------- NATS

/// NATS both ways (RAW_QUE → the stream → RAW_ARCHIVE) through `fault`: aqgate's link at
/// `url`, the stream looked at on `nats_port`. The stream holds each message once
/// (outbound exactly once), RAW_ARCHIVE too (inbound exactly once).
async fn nats_ledger(url: &str, nats_port: u16, mut fault: Fault<'_>, n_rounds: usize) {
    let started = Instant::now();
    let t = tag();
    let stream = format!("AQGT_{}", t.to_uppercase());
    let subject = format!("aqgt.{t}.orders");
    let topo = nats_topology("gateway-nats-faults", url, QUICK_RECONNECT, &subject, &stream);
    let db = fresh_pg_url().await;
    let port = free_port();
    let s = serve("gateway brokers", &db, port, &topo);
    wait_until("the NATS link CONNECTED", Duration::from_secs(30), || {
        link_state(&db, "NATS").as_deref() == Some("CONNECTED")
    });
    let total = rounds(&db, port, "NATS", &mut fault, n_rounds, 100, false, |_| tokio::spawn(async {})).await;
    settled(&db, port, total).await;

    let js = jetstream(nats_port).await;
    assert_eq!(stream_messages(&js, &stream).await, total as u64, "the stream holds each message once");
    for job in ["TO_NATS", "FROM_NATS"] {
        assert_eq!(in_doubt(&db, job), 0, "{job}");
    }
    wait_until("the NATS link CONNECTED again", Duration::from_secs(30), || {
        link_state(&db, "NATS").as_deref() == Some("CONNECTED")
    });
    println!(
        "nats, {}: {total} messages each way: 0 lost, 0 duplicated (stream and AQ); {:?}",
        fault.what(),
        started.elapsed()
    );
    drop(s);
    let _ = js.delete_stream(&stream).await;
    let _ = std::fs::remove_file(&topo);
}

/// NATS (a private `nats-server -js`) killed -9 and started again on the same port and
/// store, eight times while messages flow both ways: 0 lost, 0 duplicated in the stream
/// and in AQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_both_ways_exactly_once_through_broker_kills() {
    let mut b = Broker::nats();
    let (url, p) = (format!("nats://127.0.0.1:{}", b.port), b.port);
    nats_ledger(&url, p, Fault::Kill(&mut b), 8).await;
}

/// NATS (the shared server) behind a proxy that cuts aqgate's connections eight times
/// while messages flow both ways: 0 lost, 0 duplicated in the stream and in AQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_both_ways_exactly_once_through_cut_connections() {
    let proxy = CutProxy::start(4222);
    let url = format!("nats://127.0.0.1:{}", proxy.port);
    nats_ledger(&url, 4222, Fault::Cut(&proxy), 8).await;
    assert_cut_live(&proxy);
}

// ---------------------------------------------------------------- RabbitMQ

/// Publishes messages `range` to queue `q` (persistent, message id `m-TAG-i`), each
/// until the broker confirms it, reconnecting while the broker is away: a publish that
/// failed after it arrived goes twice, with the same message id, as any careful
/// publisher's would.
fn rabbit_feed(amqp_port: u16, q: String, t: String, range: Range<usize>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut conn: Option<(lapin::Connection, lapin::Channel)> = None;
        for i in range {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                assert!(Instant::now() < deadline, "the feed could not publish {i} within 2 minutes");
                if conn.is_none() {
                    conn = rabbit_channel(amqp_port).await.ok();
                }
                let Some((_, ch)) = &conn else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let (body, props) = amqp_numbered(&t, i);
                let sent = ch.basic_publish("".into(), q.as_str().into(), BasicPublishOptions::default(), &body, props);
                let ok = match tokio::time::timeout(Duration::from_secs(10), async { sent.await?.await }).await {
                    Ok(Ok(c)) => c.is_ack(),
                    _ => false,
                };
                if ok {
                    break;
                }
                conn = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    })
}

/// RabbitMQ both ways through `fault`: aqgate's link at `url`, the test's own clients on
/// `amqp_port`. Outbound (RAW_QUE → a durable queue): nothing lost, a message there twice
/// only with a copy marked x-aqgate-redelivered. Inbound (a publisher with confirms and
/// message ids, itself publishing again what it could not confirm → RAW_ARCHIVE): exactly
/// once.
async fn rabbit_ledger(url: &str, amqp_port: u16, mut fault: Fault<'_>, n_rounds: usize) {
    let started = Instant::now();
    let t = tag();
    let (qout, qin) = (format!("aqgt.{t}.out"), format!("aqgt.{t}.in"));
    let topo = rabbit_topology("gateway-rabbit-faults", url, QUICK_RECONNECT, &qout, &qin);
    let (_c, ch) = rabbit_channel(amqp_port).await.expect("RabbitMQ");
    ch.queue_declare(qin.as_str().into(), QueueDeclareOptions::durable(), FieldTable::default())
        .await
        .expect("declare the inbound queue");
    let db = fresh_pg_url().await;
    let port = free_port();
    let s = serve("gateway brokers", &db, port, &topo);
    wait_until("the RabbitMQ link CONNECTED", Duration::from_secs(30), || {
        link_state(&db, "RABBIT").as_deref() == Some("CONNECTED")
    });
    if let Fault::Kill(b) = &mut fault {
        // RabbitMQ writes a queue's declaration to disk lazily: a kill -9 soon after the
        // declarations loses the queues, and with them the messages it confirmed into
        // them (seen: one of the two queues recovered). A graceful restart first writes
        // them; the kills are then about the messages only.
        b.stop();
        b.start();
        wait_until("the RabbitMQ link CONNECTED after the restart", Duration::from_secs(60), || {
            link_state(&db, "RABBIT").as_deref() == Some("CONNECTED")
        });
    }
    let feed = |r: Range<usize>| rabbit_feed(amqp_port, qin.clone(), t.clone(), r);
    let total = rounds(&db, port, "RABBIT", &mut fault, n_rounds, 100, false, feed).await;
    settled(&db, port, total).await;

    let (_c, ch) = rabbit_channel(amqp_port).await.expect("RabbitMQ");
    let copies = copies_of(rabbit_drain(&ch, &qout).await);
    let dups = assert_marked_ledger("rabbitmq outbound", &copies, total);
    assert_eq!(in_doubt(&db, "TO_RABBIT"), 0);
    wait_until("the RabbitMQ link CONNECTED again", Duration::from_secs(30), || {
        link_state(&db, "RABBIT").as_deref() == Some("CONNECTED")
    });
    println!(
        "rabbitmq, {}: {total} messages each way: 0 lost; outbound {dups} duplicates, all marked; inbound 0 duplicated; {:?}",
        fault.what(),
        started.elapsed()
    );
    drop(s);
    let _ = ch.queue_delete(qout.as_str().into(), Default::default()).await;
    let _ = ch.queue_delete(qin.as_str().into(), Default::default()).await;
    let _ = std::fs::remove_file(&topo);
}

/// RabbitMQ (a private node of its own) killed -9 and started again on the same port and
/// Mnesia directory, five times while messages flow both ways: 0 lost; outbound
/// duplicates only marked; inbound 0 duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_both_ways_through_broker_kills() {
    let mut b = Broker::rabbitmq(&tag());
    let (url, p) = (format!("amqp://127.0.0.1:{}/%2f", b.port), b.port);
    rabbit_ledger(&url, p, Fault::Kill(&mut b), 5).await;
}

/// RabbitMQ (the shared node) behind a proxy that cuts aqgate's connections eight times
/// while messages flow both ways: 0 lost; outbound duplicates only marked; inbound 0
/// duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_both_ways_through_cut_connections() {
    let proxy = CutProxy::start(5672);
    let url = format!("amqp://127.0.0.1:{}/%2f", proxy.port);
    rabbit_ledger(&url, 5672, Fault::Cut(&proxy), 8).await;
    assert_cut_live(&proxy);
}

// ---------------------------------------------------------------- a window of batches

/// What fails under a window of batches (see [`rabbit_window`]).
#[derive(PartialEq)]
enum WindowFault {
    None,
    /// Every connection through the proxy cut once a tenth of the backlog is at the broker.
    Cut,
    /// The queue at the broker holds a tenth of the backlog and refuses (nacks) what comes
    /// beyond it (`x-overflow = reject-publish`) until the test takes what it holds.
    Full,
}

/// An outbound job to RabbitMQ with `batches_in_flight = 8` (batches of 10) behind a proxy
/// that refuses it until a backlog of `total` messages waits in RAW_QUE, so that the job
/// moves the backlog with its window full, through `fault`. What the queue at the broker
/// held, in its order, once RAW_QUE is empty and nothing is in doubt: (number, marked);
/// and the server (its log told when a test fails).
async fn rabbit_window(total: usize, fault: WindowFault) -> (Vec<(usize, bool)>, Proc) {
    let t = tag();
    let qout = format!("aqgt.{t}.window");
    let (c, ch) = rabbit_channel(5672).await.expect("RabbitMQ");
    let mut args = FieldTable::default();
    if fault == WindowFault::Full {
        args.insert("x-max-length".into(), lapin::types::AMQPValue::LongLongInt(total as i64 / 10));
        args.insert("x-overflow".into(), lapin::types::AMQPValue::LongString("reject-publish".into()));
    }
    ch.queue_declare(qout.as_str().into(), QueueDeclareOptions::durable(), args).await.expect("declare the queue");
    let proxy = CutProxy::start(5672);
    proxy.refuse(true);
    let toml = format!(
        "\n[[gateway.links]]\nname = \"rabbit\"\nkind = \"rabbitmq\"\nurl = \"amqp://127.0.0.1:{}/%2f\"\n\
         username = \"guest\"\npassword_env = \"AQGT_RABBIT_PASSWORD\"\n{QUICK_RECONNECT}\n\
         \n[[gateway.foreign_queues]]\nname = \"out\"\nlink = \"rabbit\"\nnative_name = \"{qout}\"\n\
         \n[[gateway.jobs]]\nname = \"to_rabbit\"\nsource = \"AQUSER.RAW_QUE\"\ndestination = \"out@rabbit\"\n\
         batch_size = 10\nbatches_in_flight = 8\n",
        proxy.port
    );
    let topo = demo_topology_with("gateway-window", &toml);
    let db = fresh_pg_url().await;
    let port = free_port();
    let s = serve("gateway window", &db, port, &topo);
    send_numbered(port, "AQUSER.RAW_QUE", 0, total, 100, "").await;
    proxy.refuse(false);
    let at_broker = || async {
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        let ch = c.create_channel().await.expect("a channel");
        let n = ch
            .queue_declare(qout.as_str().into(), passive, FieldTable::default())
            .await
            .map_or(0, |q| q.message_count());
        let _ = ch.close(200, "".into()).await;
        n as usize
    };
    if fault != WindowFault::None {
        let began = Instant::now();
        while at_broker().await < total / 10 {
            assert!(began.elapsed() < Duration::from_secs(120), "the job did not start on its backlog");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    if fault == WindowFault::Cut {
        let cuts = proxy.cut();
        println!("cut {cuts} connections with {} at the broker", at_broker().await);
        assert!(cuts > 0, "a live connection cut");
    } else if fault == WindowFault::Full {
        // The job meets the full queue and tries again (its link's backoff) meanwhile.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let mut seen = Vec::new();
    let began = Instant::now();
    while depth(&db, "AQUSER.RAW_QUE") != 0 || in_doubt(&db, "TO_RABBIT") != 0 {
        assert!(began.elapsed() < Duration::from_secs(180), "the backlog not moved: {:?}", depths(&db));
        seen.extend(rabbit_drain(&ch, &qout).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen.extend(rabbit_drain(&ch, &qout).await);
    let _ = ch.queue_delete(qout.as_str().into(), Default::default()).await;
    let _ = std::fs::remove_file(&topo);
    let seen = seen.into_iter().map(|(p, marked)| (usize::from_str_radix(&p, 16).expect("a numbered payload"), marked));
    (seen.collect(), s)
}

/// A backlog through a window of eight batches: every message once, in the source's order,
/// none marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_window_of_batches_moves_a_backlog_in_order() {
    let total = 1500;
    let (seen, _s) = rabbit_window(total, WindowFault::None).await;
    let expected: Vec<(usize, bool)> = (0..total).map(|i| (i, false)).collect();
    assert!(seen == expected, "not each once in order, unmarked: {:?}", &seen[..seen.len().min(50)]);
}

/// Nothing lost; a message there twice only with a copy marked; with `in_order`, the first
/// copies in the source's order. How many copies were marked.
fn assert_window_ledger(what: &str, seen: &[(usize, bool)], total: usize, in_order: bool) -> usize {
    let copies = copies_of(seen.iter().map(|&(i, marked)| (hex(i), marked)));
    let dups = assert_marked_ledger(what, &copies, total);
    let marked = seen.iter().filter(|(_, m)| *m).count();
    let mut first = std::collections::HashSet::new();
    let order: Vec<usize> = seen.iter().map(|&(i, _)| i).filter(|i| first.insert(*i)).collect();
    let ordered = order.windows(2).all(|w| w[0] < w[1]);
    assert!(ordered || !in_order, "{what}: first copies out of order");
    println!("{what}: {total} messages, 0 lost, {dups} duplicates, {marked} marked, first copies in order: {ordered}");
    marked
}

/// The connection cut under a full window: nothing lost, a duplicate only marked, in order
/// (the batches confirmed before the cut land; the others go again, marked).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_window_cut_in_the_middle_loses_nothing() {
    let total = 3000;
    let (seen, _s) = rabbit_window(total, WindowFault::Cut).await;
    assert_window_ledger("the window, cut", &seen, total, true);
}

/// The broker refusing a batch in the middle of a full window (its queue full): the batch
/// and every batch published behind it are taken back and go again, marked; nothing lost.
/// (Not in order: a queue that refuses one message may take the next once the test has
/// taken some, and that one goes again too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_window_refused_in_the_middle_marks_what_goes_again() {
    let total = 3000;
    let (seen, _s) = rabbit_window(total, WindowFault::Full).await;
    let marked = assert_window_ledger("the window, refused", &seen, total, false);
    assert!(marked > 0, "nothing went again marked after the refusal");
}

// ---------------------------------------------------------------- MQTT

/// MQTT both ways through `fault`: aqgate's link at `url`, the test's own clients on
/// `mqtt_port`. Outbound (RAW_QUE → a topic a bare subscriber with a persistent session
/// reads): nothing lost, a message twice only with a copy marked (the broker's own
/// redeliveries to that subscriber, DUP set, not counted). Inbound (a bare publisher with
/// `aq-message-id`, each round acknowledged before the fault → RAW_ARCHIVE): exactly once.
async fn mqtt_ledger(url: &str, mqtt_port: u16, mut fault: Fault<'_>, n_rounds: usize) {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let started = Instant::now();
    let t = tag();
    let (tout, tin) = (format!("aqgt/{t}/out"), format!("aqgt/{t}/in"));
    let topo = mqtt_topology("gateway-mqtt-faults", url, QUICK_RECONNECT, &tout, &tin, &t);
    // The bare subscriber: a persistent session, polling on (and so reconnecting) through
    // the faults.
    let (_sub, mut seen_rx) = mqtt_subscriber(&t, mqtt_port, &tout).await;

    let db = fresh_pg_url().await;
    let port = free_port();
    let s = serve("gateway brokers", &db, port, &topo);
    wait_until("the MQTT link CONNECTED", Duration::from_secs(30), || {
        link_state(&db, "MQTT").as_deref() == Some("CONNECTED")
    });
    // The inbound job's session subscribed: what is published from now on is kept for it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let feed = |r: Range<usize>| {
        let tin = tin.clone();
        let t = t.clone();
        tokio::spawn(async move {
            let o = MqttOptions::new(format!("aqgt-test-pub-{t}-{}", r.start), "127.0.0.1", mqtt_port);
            let (publ, mut pub_loop) = AsyncClient::new(o, 1000);
            let n = r.len();
            for i in r {
                let (body, props) = mqtt_numbered(&t, i);
                publ.publish_with_properties(tin.clone(), QoS::AtLeastOnce, false, body, props).await.expect("publish");
            }
            let mut acked = 0;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while acked < n {
                match tokio::time::timeout_at(deadline, pub_loop.poll()).await.expect("the round's PUBACKs") {
                    Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                    Ok(_) => {}
                    Err(e) => panic!("the publisher's connection failed: {e}"),
                }
            }
            let _ = publ.disconnect().await;
        })
    };
    // Each round's publishes are acknowledged before the fault: a fault during them would
    // make this bare client (not aqgate) lose or repeat them.
    let total = rounds(&db, port, "MQTT", &mut fault, n_rounds, 100, true, feed).await;
    settled(&db, port, total).await;
    let mut copies = Copies::new();
    let mut broker_redeliveries = 0;
    while let Ok(Some((p, marked, dup))) = tokio::time::timeout(Duration::from_secs(3), seen_rx.recv()).await {
        if dup && copies.contains_key(&p) {
            broker_redeliveries += 1;
            continue;
        }
        count_copy(&mut copies, p, marked);
    }
    let dups = assert_marked_ledger("mqtt outbound", &copies, total);
    wait_until("the MQTT link CONNECTED again", Duration::from_secs(30), || {
        link_state(&db, "MQTT").as_deref() == Some("CONNECTED")
    });
    println!(
        "mqtt, {}: {total} messages each way: 0 lost; outbound {dups} duplicates, all marked \
         ({broker_redeliveries} redeliveries by the broker to the subscriber); inbound 0 duplicated; {:?}",
        fault.what(),
        started.elapsed()
    );
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

/// Mosquitto (a private instance with persistence) stopped and started again on the same
/// port and data six times while messages flow both ways: 0 lost; outbound duplicates
/// only marked; inbound 0 duplicated. Stopped with SIGTERM, not killed -9: Mosquitto
/// writes its persistence only periodically (`autosave_interval`) and at shutdown, so a
/// kill -9 loses what it had acknowledged (sessions and queued messages alike): the
/// broker's own limit, which no client can make up for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mqtt_both_ways_through_broker_restarts() {
    let mut b = Broker::mosquitto();
    let (url, p) = (format!("mqtt://127.0.0.1:{}", b.port), b.port);
    mqtt_ledger(&url, p, Fault::Stop(&mut b), 6).await;
}

/// MQTT (the shared Mosquitto) behind a proxy that cuts aqgate's connections eight times
/// while messages flow both ways: 0 lost; outbound duplicates only marked; inbound 0
/// duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mqtt_both_ways_through_cut_connections() {
    let proxy = CutProxy::start(1883);
    let url = format!("mqtt://127.0.0.1:{}", proxy.port);
    mqtt_ledger(&url, 1883, Fault::Cut(&proxy), 8).await;
    assert_cut_live(&proxy);
}
