//! The queue engine's conformance suite, run against both store backends (SQLite and
//! PostgreSQL): every test here exists twice, `sqlite::name` and `postgres::name`.

mod common;

use std::time::{Duration, Instant};

use aqgate_core::clock::Clock;
use aqgate_core::error::code;
use aqgate_proto::idap::Response;
use common::*;

macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Sqlite).await } )*
        }
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Postgres).await } )*
        }
    };
}

on_both_backends!(
    send_then_receive_in_fifo_order,
    on_commit_work_is_invisible_until_commit,
    rollback_discards_enqueues,
    a_commit_of_its_own_performs_the_sessions_removes_and_enqueues,
    a_transaction_the_store_lost_part_of_must_roll_back,
    exception_queues_are_of_the_messages_own_queue_table,
    a_queue_with_messages_keeps_its_payload_type,
    conditions_naming_nothing_the_queue_has_are_refused,
    a_multi_consumer_message_moves_once_no_consumer_can_take_it,
    a_consumer_that_gave_up_sends_the_message_to_the_exception_queue_in_either_order,
    max_retries_on_a_multi_consumer_queue_in_any_order,
    a_message_that_cannot_be_returned_stays_where_it_was,
    immediate_enqueue_is_visible_at_once,
    rolled_back_remove_returns_the_message_with_a_delivery_count,
    browse_does_not_remove_and_navigates,
    locked_messages_are_skipped_by_others_until_commit,
    a_batch_receive_takes_what_no_one_else_holds,
    a_job_batch_leaves_no_session_row,
    a_job_batch_in_one_transaction_moves_all_or_nothing,
    a_job_batch_ended_by_a_restart_does_not_count_against_its_messages,
    priority_queues_sort_by_priority_then_time,
    selectors_by_correlation_message_id_and_condition,
    multi_consumer_fan_out_and_recipient_lists,
    consumer_name_rules,
    later_subscribers_see_only_later_messages,
    delayed_messages_wait,
    expired_messages_move_to_the_exception_queue,
    a_message_locked_while_expiring_stays_with_its_consumer,
    a_request_is_all_or_nothing,
    two_consumers_never_remove_the_same_message,
    concurrent_senders_are_all_stored,
    a_restart_keeps_open_sessions,
    recovery_rolls_back_only_what_no_session_owns,
    idle_sessions_roll_back,
    a_session_changed_meanwhile_refuses_the_stale_request,
    idempotency_records_are_per_agent_and_kept_for_the_window,
    saml_assertion_ids_are_used_once_until_purged,
    adt_payload_round_trips_examples,
    privileges_are_enforced,
    registrations,
    notification_aliases_resolve_through_the_directory,
    notification_outbox_is_transactional,
    notification_outbox_survives_restart_with_its_session,
    notification_retries_park_and_unpark,
    notification_claims_are_shaped_per_target,
    multi_consumer_notifications_follow_deliveries,
    long_poll_wakes_on_commit,
    too_many_failed_dequeues_move_to_exception_queue,
    payload_conditions_on_adt_and_jms,
    disabled_queues_refuse,
    consumers_removing_at_once_leave_no_orphans,
    xml_and_jms_map_payloads_round_trip,
    many_open_sessions_share_few_connections,
    directory_destinations_and_agent_aliases,
    mail_spool_stores_dedupes_and_retries,
    held_mail_is_performed_and_answered_only_once_accepted,
    re_sent_mail_is_answered_in_its_thread_and_encryption_is_kept,
    concurrent_spooling_and_sending_all_commit,
    large_committed_sends_are_whole_and_in_order,
    propagation_job_leases_and_reports,
    propagation_job_backlog_counts_what_the_job_would_take,
    grouped_multi_consumer_queues_hold_a_group_per_consumer,
    grouped_queues_order_groups_by_their_first_message,
    gateway_doubts_go_with_their_messages_and_their_job,
    control_counters_follow_the_topology_and_pings,
);

const RAWQ: &str = "AQUSER.RAW_QUE";

async fn depth(h: &Harness, queue: &str) -> i64 {
    aqgate_admin::queues(h.engine.store().as_ref())
        .await
        .expect("queues")
        .into_iter()
        .find(|q| q.name == queue)
        .map(|q| q.depth)
        .expect("queue listed")
}

fn fault_code(r: Result<Response, (i32, String)>) -> i32 {
    match r {
        Err((c, _)) => c,
        Ok(r) => panic!("expected a fault, got {r:?}"),
    }
}

async fn recv_raw(h: &Harness, s: &mut aqgate_core::engine::Session, opts: &str, extra: &str) -> Result<String, i32> {
    match h.run(s, &receive(RAWQ, &format!("<wait_time>0</wait_time>{opts}"), extra)).await {
        Ok(r) => Ok(raw_of(&received(&r)[0])),
        Err((c, _)) => Err(c),
    }
}

async fn send_then_receive_in_fifo_order(b: Backend) {
    let h = Harness::new(b).await;
    let mut s = h.session("scott");
    let r = h.run(&mut s, &raw_send(RAWQ, &[("", "01"), ("", "02"), ("", "0A0b")], COMMIT)).await.expect("send");
    let ids = sent_ids(&r);
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|i| i.len() == 32 && i.chars().all(|c| c.is_ascii_hexdigit())));
    assert_eq!(depth(&h, RAWQ).await, 3);
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("01".into()));
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("02".into()));
    let r = h.run(&mut c, &receive(RAWQ, "<wait_time>0</wait_time>", COMMIT)).await.expect("third");
    let m = &received(&r)[0];
    assert_eq!(raw_of(m), "0A0B");
    assert_eq!(m.header.message_id.as_deref(), Some(ids[2].as_str()));
    assert_eq!(m.header.message_state, Some(0));
    assert_eq!(m.header.delivery_count, Some(0));
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Err(code::NO_MESSAGE));
    assert_eq!(depth(&h, RAWQ).await, 0);
}

async fn on_commit_work_is_invisible_until_commit(b: Backend) {
    let h = Harness::new(b).await;
    let mut a = h.session("scott");
    let mut other = h.session("scott");
    h.run(&mut a, &raw_send(RAWQ, &[("", "AA")], "")).await.expect("send");
    assert_eq!(depth(&h, RAWQ).await, 0, "uncommitted enqueue is not counted");
    assert_eq!(recv_raw(&h, &mut other, "", "").await, Err(code::NO_MESSAGE));
    // The sender's own transaction sees its message (and does not take it here: BROWSE).
    assert_eq!(recv_raw(&h, &mut a, "<dequeue_mode>BROWSE</dequeue_mode>", "").await, Ok("AA".into()));
    h.run(&mut a, &envelope(COMMIT)).await.expect("commit");
    assert_eq!(recv_raw(&h, &mut other, "", COMMIT).await, Ok("AA".into()));
}

/// AQXmlCommit as a request of its own, after ON_COMMIT removes and enqueues: the
/// removes happen, the enqueues appear (a session that only enqueued skips the dequeue
/// bookkeeping; one that dequeued must not).
async fn a_commit_of_its_own_performs_the_sessions_removes_and_enqueues(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01"), ("", "02")], COMMIT)).await.expect("send");
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", "").await, Ok("01".into()), "an ON_COMMIT remove");
    h.run(&mut c, &envelope(COMMIT)).await.expect("commit the remove");
    assert_eq!(depth(&h, RAWQ).await, 1, "removed at the commit");
    // Enqueue and remove in one transaction, committed on its own.
    h.run(&mut c, &raw_send(RAWQ, &[("", "03")], "")).await.expect("send in the transaction");
    assert_eq!(recv_raw(&h, &mut c, "", "").await, Ok("02".into()));
    h.run(&mut c, &envelope(COMMIT)).await.expect("commit both");
    let mut other = h.session("scott");
    assert_eq!(recv_raw(&h, &mut other, "", COMMIT).await, Ok("03".into()), "02 is gone, 03 is there");
    assert_eq!(recv_raw(&h, &mut other, "", COMMIT).await, Err(code::NO_MESSAGE));
    // Enqueues alone, committed on their own.
    h.run(&mut c, &raw_send(RAWQ, &[("", "04")], "")).await.expect("send");
    h.run(&mut c, &envelope(COMMIT)).await.expect("commit the send");
    assert_eq!(recv_raw(&h, &mut other, "", COMMIT).await, Ok("04".into()));
}

/// Runs `sql` on the harness's database, as another client would.
async fn sql_on(h: &Harness, b: Backend, sql: &str) {
    use sqlx::Connection;
    match b {
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&h.url).await.expect("connect");
            sqlx::raw_sql(sql).execute(&mut c).await.expect(sql);
        }
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&h.url).await.expect("connect");
            sqlx::raw_sql(sql).execute(&mut c).await.expect(sql);
        }
    }
}

/// What a database crash does to a session's provisional writes (`begin_provisional`):
/// the newest message the session's open transaction enqueued is gone.
async fn lose_the_newest_uncommitted_message(h: &Harness, b: Backend) {
    let newest = "(SELECT max(seq) FROM messages WHERE enq_txn IS NOT NULL)";
    sql_on(
        h,
        b,
        &format!("DELETE FROM deliveries WHERE msg_seq = {newest}; DELETE FROM messages WHERE seq = {newest}"),
    )
    .await;
}

/// A commit publishes exactly what its transaction enqueued, or nothing: when the store
/// lost part of it (a database crash after a send answered), the commit is refused with
/// ORA-25402 until the client rolls back, also when the commit comes with a send.
async fn a_transaction_the_store_lost_part_of_must_roll_back(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01"), ("", "02")], "")).await.expect("send");
    lose_the_newest_uncommitted_message(&h, b).await;
    let (c, msg) = h.run(&mut p, &envelope(COMMIT)).await.expect_err("part of the transaction is gone");
    assert_eq!(c, code::TRANSACTION_LOST);
    assert!(msg.contains("1 of the 2"), "{msg}");
    let (c, _) = h.run(&mut p, &raw_send(RAWQ, &[("", "03")], COMMIT)).await.expect_err("a send with a commit too");
    assert_eq!(c, code::TRANSACTION_LOST);
    let mut other = h.session("scott");
    assert_eq!(recv_raw(&h, &mut other, "", COMMIT).await, Err(code::NO_MESSAGE), "nothing was published");
    h.run(&mut p, &envelope(ROLLBACK)).await.expect("rollback");
    assert_eq!(depth(&h, RAWQ).await, 0, "the rollback removed what was left");
    h.run(&mut p, &raw_send(RAWQ, &[("", "04")], "")).await.expect("a new transaction");
    h.run(&mut p, &envelope(COMMIT)).await.expect("commits");
    assert_eq!(recv_raw(&h, &mut other, "", COMMIT).await, Ok("04".into()));
}

/// A message's own exception queue must be an exception queue of its queue table: any
/// other queue would take messages of another type, or let a sender reach a queue it may
/// not enqueue to. A name that does not exist yet falls back to the default at the move.
async fn exception_queues_are_of_the_messages_own_queue_table(b: Backend) {
    let topo = format!(
        "{}\n[[queues]]\nname = \"AQUSER.RAW_ERRORS\"\nqueue_table = \"AQUSER.RAW_TAB\"\nexception = true\n",
        aqgate_admin::DEFAULT_TOPOLOGY
    );
    let h = Harness::with_topology(b, &topo).await;
    let mut p = h.session("scott");
    for other in ["OE.OE_NEW_ORDERS_QUE", "AQUSER.EMP_TOPIC", "AQUSER.RAW_QUE", "AQUSER.AQ$_XML_TAB_E"] {
        let hdr = format!("<expiration>1</expiration><exception_queue>{other}</exception_queue>");
        let (c, msg) = h.run(&mut p, &raw_send(RAWQ, &[(&hdr, "01")], COMMIT)).await.expect_err(other);
        assert_eq!(c, code::INVALID_VALUE, "{other}: {msg}");
        assert!(msg.contains("AQUSER.RAW_TAB"), "{msg}");
    }
    assert_eq!(depth(&h, RAWQ).await, 0);
    assert_eq!(
        fault_code(h.run(&mut p, &raw_send("AQUSER.RAW_ERRORS", &[("", "01")], COMMIT)).await),
        code::ENQUEUE_DISABLED,
        "nobody enqueues to an exception queue"
    );
    let named = "<expiration>1</expiration><exception_queue>aquser.raw_errors</exception_queue>";
    let unknown = "<expiration>1</expiration><exception_queue>AQUSER.NOT_YET</exception_queue>";
    h.run(&mut p, &raw_send(RAWQ, &[(named, "0A"), (unknown, "0B")], COMMIT)).await.expect("send");
    h.clock.advance_secs(2);
    assert_eq!(h.engine.expire_messages().await.expect("tm"), 2);
    assert_eq!(depth(&h, "AQUSER.AQ$_RAW_TAB_E").await, 1, "a name that does not exist: the default");
    let mut c = h.session("scott");
    let r = h.run(&mut c, &receive("AQUSER.RAW_ERRORS", "<wait_time>0</wait_time>", COMMIT)).await.expect("named");
    let m = &received(&r)[0];
    assert_eq!(raw_of(m), "0A");
    assert_eq!(m.header.message_state, Some(3));
    assert_eq!(m.header.exception_queue.as_deref(), Some("AQUSER.RAW_ERRORS"), "it names the queue it is in");
    // The one whose exception queue does not exist is in the default, and names none (as
    // Oracle answers it: NULL).
    let r = h.run(&mut c, &receive("AQUSER.AQ$_RAW_TAB_E", "<wait_time>0</wait_time>", COMMIT)).await.expect("default");
    let m = &received(&r)[0];
    assert_eq!((raw_of(m).as_str(), m.header.exception_queue.as_deref()), ("0B", None));

    // Too many failed dequeues move it to its own exception queue too.
    let named = "<exception_queue>AQUSER.RAW_ERRORS</exception_queue>";
    h.run(&mut p, &raw_send(RAWQ, &[(named, "0C")], COMMIT)).await.expect("send");
    for i in 0..6 {
        assert_eq!(recv_raw(&h, &mut c, "", "").await, Ok("0C".into()), "attempt {i}");
        h.run(&mut c, &envelope(ROLLBACK)).await.expect("rollback");
    }
    assert_eq!(depth(&h, RAWQ).await, 0);
    assert_eq!(depth(&h, "AQUSER.RAW_ERRORS").await, 1);
}

/// `admin apply` refuses to change the payload type (or the consumer model) of a queue
/// that holds messages: they could not be read any more. Once it is empty, it may.
async fn a_queue_with_messages_keeps_its_payload_type(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01")], COMMIT)).await.expect("send");
    let retyped = aqgate_admin::DEFAULT_TOPOLOGY.replace(
        "name = \"AQUSER.RAW_TAB\"\npayload_type = \"RAW\"",
        "name = \"AQUSER.RAW_TAB\"\npayload_type = \"SYS.XMLTYPE\"",
    );
    assert_ne!(retyped, aqgate_admin::DEFAULT_TOPOLOGY);
    let t = aqgate_core::topology::Topology::from_toml(&retyped).expect("topology");
    let store = h.engine.store();
    for dry_run in [true, false] {
        let e = aqgate_admin::apply(store.as_ref(), &t, dry_run).await.expect_err("refused");
        assert!(e.to_string().contains("AQUSER.RAW_QUE holds 1 message"), "{e}");
    }
    assert_eq!(recv_raw(&h, &mut p, "", COMMIT).await, Ok("01".into()), "still RAW, still readable");
    let changes = aqgate_admin::apply(store.as_ref(), &t, false).await.expect("empty now");
    assert!(!changes.is_empty());
}

/// A condition naming something no message of the queue can have would match nothing,
/// silently, for the whole wait: it is refused at once (25200), naming the name.
async fn conditions_naming_nothing_the_queue_has_are_refused(b: Backend) {
    let h = Harness::new(b).await;
    let mut c = h.session("scott");
    let on = |q: &str, consumer: &str, cond: &str| {
        receive(
            q,
            &format!("{consumer}<wait_time>30</wait_time><selector><condition>{cond}</condition></selector>"),
            "",
        )
    };
    let app1 = "<consumer_name>APP1</consumer_name>";
    let started = Instant::now();
    for (q, consumer, cond, named) in [
        ("AQUSER.EMP_TOPIC", app1, "tab.user_data.nosuch = 1", "tab.user_data.nosuch"),
        ("AQUSER.EMP_TOPIC", app1, "deptno = 60", "deptno"),
        ("AQUSER.EMP_TOPIC", app1, "tab.nosuch = 1", "tab.nosuch"),
        ("AQUSER.EMP_TOPIC", app1, "\"Country\" = 'Canada'", "Country"),
        (RAWQ, "", "priority = 1 OR tab.user_data.x = 1", "tab.user_data.x"),
        ("AQUSER.JMS_TEXTQ", "", "tab.user_data.nosuch = 1", "tab.user_data.nosuch"),
        ("QS.NEW_ORDERS_QUE", "", "tab.user_data.customer.planet = 'Mars'", "customer.planet"),
        ("QS.NEW_ORDERS_QUE", "", "tab.user_data.orderno.digits = 1", "orderno.digits"),
    ] {
        let (code, msg) = h.run(&mut c, &on(q, consumer, cond)).await.expect_err(cond);
        assert_eq!(code, code::BAD_CONDITION, "{cond}: {msg}");
        assert!(msg.contains(named), "{cond}: {msg}");
    }
    assert!(started.elapsed() < Duration::from_secs(10), "refused, not waited for");
    for (q, consumer, cond) in [
        ("AQUSER.EMP_TOPIC", app1, "tab.user_data.deptno = 60 AND priority >= 0 AND corrid IS NULL"),
        ("AQUSER.JMS_TEXTQ", "", "Country = 'Canada' AND \"Region\" IS NULL AND tab.user_data.text_data IS NULL"),
        ("AQUSER.XML_QUE", "", "tab.user_data.order.id = 7"),
        ("QS.NEW_ORDERS_QUE", "", "tab.user_data.customer.country = 'USA' OR tab.user_data.items IS NULL"),
    ] {
        let xml = on(q, consumer, cond).replace("<wait_time>30</wait_time>", "<wait_time>0</wait_time>");
        assert_eq!(fault_code(h.run(&mut c, &xml).await), code::NO_MESSAGE, "{cond}");
    }
}

/// A stored message that cannot be turned back into XML (here: bytes that are no UTF-8 in
/// an XMLType queue) gets fault 600, and the fault changes nothing: not removed, not
/// locked, whichever way it was asked for.
async fn a_message_that_cannot_be_returned_stays_where_it_was(b: Backend) {
    let h = Harness::new(b).await;
    let q = "AQUSER.XML_QUE";
    let mut p = h.session("scott");
    h.run(&mut p, &send_payload(q, "<xml_data><order id=\"7\"/></xml_data>")).await.expect("send");
    let garbage = match b {
        Backend::Postgres => "'\\xff'::bytea",
        Backend::Sqlite => "X'FF'",
    };
    sql_on(&h, b, "CREATE TABLE kept AS SELECT msgid, payload FROM messages").await;
    sql_on(&h, b, &format!("UPDATE messages SET payload = {garbage}")).await;
    let mut c = h.session("scott");
    for (how, opts, extra) in [
        ("REMOVE with a commit", "<wait_time>0</wait_time>", COMMIT),
        ("REMOVE in a transaction", "<wait_time>0</wait_time>", ""),
        ("LOCKED", "<wait_time>0</wait_time><dequeue_mode>LOCKED</dequeue_mode>", ""),
        ("BROWSE", "<wait_time>0</wait_time><dequeue_mode>BROWSE</dequeue_mode>", ""),
        ("IMMEDIATE", "<wait_time>0</wait_time><visibility>IMMEDIATE</visibility>", ""),
    ] {
        assert_eq!(fault_code(h.run(&mut c, &receive(q, opts, extra)).await), code::INTERNAL, "{how}");
        assert_eq!(depth(&h, q).await, 1, "{how}: still there");
    }
    h.run(&mut c, &envelope(COMMIT)).await.expect("nothing to commit");
    sql_on(&h, b, "UPDATE messages SET payload = (SELECT payload FROM kept WHERE kept.msgid = messages.msgid)").await;
    let r = h.run(&mut c, &receive(q, "<wait_time>0</wait_time>", COMMIT)).await.expect("readable again, and free");
    assert_eq!(received(&r).len(), 1);
    assert_eq!(depth(&h, q).await, 0);
}

async fn rollback_discards_enqueues(b: Backend) {
    let h = Harness::new(b).await;
    let mut a = h.session("scott");
    h.run(&mut a, &raw_send(RAWQ, &[("", "AA"), ("", "BB")], "")).await.expect("send");
    let r = h.run(&mut a, &envelope(ROLLBACK)).await.expect("rollback");
    assert!(matches!(r, Response::Rollback(_)));
    h.run(&mut a, &envelope(COMMIT)).await.expect("commit after rollback");
    assert_eq!(depth(&h, RAWQ).await, 0);
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", "").await, Err(code::NO_MESSAGE));
}

async fn immediate_enqueue_is_visible_at_once(b: Backend) {
    let h = Harness::new(b).await;
    let mut a = h.session("scott");
    let xml = raw_send(RAWQ, &[("", "CC")], "").replace(
        "<destination>AQUSER.RAW_QUE</destination>",
        "<destination>AQUSER.RAW_QUE</destination><visibility>IMMEDIATE</visibility>",
    );
    h.run(&mut a, &xml).await.expect("send");
    h.run(&mut a, &envelope(ROLLBACK)).await.expect("rollback does not undo IMMEDIATE work");
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "<visibility>IMMEDIATE</visibility>", "").await, Ok("CC".into()));
    assert_eq!(depth(&h, RAWQ).await, 0, "an IMMEDIATE remove needs no commit");
}

async fn rolled_back_remove_returns_the_message_with_a_delivery_count(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01")], COMMIT)).await.expect("send");
    let mut c1 = h.session("scott");
    let mut c2 = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c1, "", "").await, Ok("01".into()));
    assert_eq!(recv_raw(&h, &mut c2, "", "").await, Err(code::NO_MESSAGE), "locked by c1's pending remove");
    h.run(&mut c1, &envelope(ROLLBACK)).await.expect("rollback");
    let r = h.run(&mut c2, &receive(RAWQ, "<wait_time>0</wait_time>", COMMIT)).await.expect("redelivered");
    assert_eq!(received(&r)[0].header.delivery_count, Some(1));
}

async fn browse_does_not_remove_and_navigates(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01"), ("", "02"), ("", "03")], COMMIT)).await.expect("send");
    let mut c = h.session("scott");
    let browse = "<dequeue_mode>BROWSE</dequeue_mode>";
    assert_eq!(recv_raw(&h, &mut c, browse, "").await, Ok("01".into()));
    assert_eq!(recv_raw(&h, &mut c, browse, "").await, Ok("02".into()));
    assert_eq!(
        recv_raw(&h, &mut c, &format!("{browse}<navigation_mode>FIRST_MESSAGE</navigation_mode>"), "").await,
        Ok("01".into())
    );
    assert_eq!(recv_raw(&h, &mut c, browse, "").await, Ok("02".into()));
    assert_eq!(recv_raw(&h, &mut c, browse, "").await, Ok("03".into()));
    assert_eq!(recv_raw(&h, &mut c, browse, "").await, Err(code::NO_MESSAGE), "end of fetch");
    assert_eq!(recv_raw(&h, &mut c, browse, "").await, Ok("01".into()), "starts over after the end");
    assert_eq!(depth(&h, RAWQ).await, 3);
    // Another session browsing keeps its own position.
    let mut d = h.session("scott");
    assert_eq!(recv_raw(&h, &mut d, browse, "").await, Ok("01".into()));
}

async fn locked_messages_are_skipped_by_others_until_commit(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01"), ("", "02")], COMMIT)).await.expect("send");
    let mut a = h.session("scott");
    let mut o = h.session("scott");
    assert_eq!(recv_raw(&h, &mut a, "<dequeue_mode>LOCKED</dequeue_mode>", "").await, Ok("01".into()));
    assert_eq!(recv_raw(&h, &mut o, "", "").await, Ok("02".into()), "01 is locked by a");
    // BROWSE sees locked messages.
    assert_eq!(
        recv_raw(&h, &mut o, "<dequeue_mode>BROWSE</dequeue_mode><navigation_mode>FIRST_MESSAGE</navigation_mode>", "")
            .await,
        Ok("01".into())
    );
    h.run(&mut a, &envelope(COMMIT)).await.expect("commit releases the lock");
    assert_eq!(
        recv_raw(&h, &mut o, "<navigation_mode>FIRST_MESSAGE</navigation_mode>", COMMIT).await,
        Ok("01".into()),
        "the locked message stays in the queue and is free after commit"
    );
}

/// A propagation job that starts ends what an earlier run of it left open
/// (`end_sessions_of`): as the job's own rollback, that does not count against the
/// messages, so however often the job restarts mid-batch, a message stays in its source
/// (never moved to the exception queue for retries) with its delivery count as it was.
async fn a_job_batch_ended_by_a_restart_does_not_count_against_its_messages(b: Backend) {
    let job = "[[queues]]\nname = \"AQUSER.RAW_ARCHIVE\"\nqueue_table = \"AQUSER.RAW_TAB\"\n\n\
               [[propagations]]\nname = \"arch\"\nsource = \"AQUSER.RAW_QUE\"\ndestination = \"AQUSER.RAW_ARCHIVE\"\n";
    let h = Harness::with_topology(b, &format!("{}\n{job}", aqgate_admin::DEFAULT_TOPOLOGY)).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01")], COMMIT)).await.expect("send");
    for run in 0..7 {
        let mut s = h.session("PROP$ARCH");
        s.propagates = true;
        let r = h.run(&mut s, &receive(RAWQ, "<wait_time>0</wait_time>", "")).await.expect("the job takes it");
        assert_eq!(received(&r).len(), 1, "run {run}");
        h.clock.advance_secs(1);
        assert_eq!(h.engine.end_sessions_of("PROP$ARCH", h.clock.now()).await.expect("end"), 1, "run {run}");
    }
    let mut c = h.session("scott");
    let r = h.run(&mut c, &receive(RAWQ, "<wait_time>0</wait_time>", COMMIT)).await.expect("still in its source");
    assert_eq!(received(&r)[0].header.delivery_count, Some(0));
}

/// A propagation job's receive takes several messages in one statement: it skips the one
/// another session holds, returns the rest in queue order, and another batch gets the others.
async fn a_batch_receive_takes_what_no_one_else_holds(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    let msgs: Vec<(&str, &str)> = ["01", "02", "03", "04", "05", "06", "07"].iter().map(|x| ("", *x)).collect();
    h.run(&mut p, &raw_send(RAWQ, &msgs, COMMIT)).await.expect("send");
    let mut other = h.session("scott");
    assert_eq!(recv_raw(&h, &mut other, "", "").await, Ok("01".into()));
    assert_eq!(
        recv_raw(
            &h,
            &mut other,
            "<dequeue_mode>LOCKED</dequeue_mode><navigation_mode>FIRST_MESSAGE</navigation_mode>",
            ""
        )
        .await,
        Ok("02".into())
    );
    let mut job = h.session("scott");
    job.max_messages = 4;
    let r = h.run(&mut job, &receive(RAWQ, "<wait_time>0</wait_time>", "")).await.expect("batch");
    assert_eq!(received(&r).iter().map(raw_of).collect::<Vec<_>>(), ["03", "04", "05", "06"]);
    let mut second = h.session("scott");
    second.max_messages = 4;
    let r = h.run(&mut second, &receive(RAWQ, "<wait_time>0</wait_time>", "")).await.expect("second batch");
    assert_eq!(received(&r).iter().map(raw_of).collect::<Vec<_>>(), ["07"], "the first batch holds its four");
    h.run(&mut other, &envelope(ROLLBACK)).await.expect("rollback");
    h.run(&mut job, &envelope(COMMIT)).await.expect("commit");
    h.run(&mut second, &envelope(COMMIT)).await.expect("commit");
    assert_eq!(depth(&h, RAWQ).await, 2, "01 and 02 are back, the batches' five are gone");
}

/// A propagation job's batch (its session moves others' messages) keeps a session row only
/// while it is open: committed or rolled back, the row goes, so a busy job never fills the
/// store with sessions until their timeout. A client's session keeps its row.
async fn a_job_batch_leaves_no_session_row(b: Backend) {
    let h = Harness::new(b).await;
    let store = h.engine.store().clone();
    let mut p = h.session("scott");
    let msgs: Vec<(&str, &str)> = ["01", "02", "03", "04"].iter().map(|x| ("", *x)).collect();
    h.run(&mut p, &raw_send(RAWQ, &msgs, COMMIT)).await.expect("send");
    let before = store.session_count().await.expect("count");
    let batch = |h: &Harness| {
        let mut s = h.session("scott");
        s.propagates = true;
        s.max_messages = 2;
        s
    };
    // Moved and committed.
    let mut job = batch(&h);
    h.run(&mut job, &receive(RAWQ, "<wait_time>0</wait_time>", "")).await.expect("receive");
    assert_eq!(store.session_count().await.expect("count"), before + 1, "open: a row to roll back after a crash");
    h.run(&mut job, &raw_send("AQUSER.RAW_QUE", &[("", "05")], COMMIT)).await.expect("send and commit");
    assert_eq!(store.session_count().await.expect("count"), before, "committed: no row left");
    // Rolled back.
    let mut job = batch(&h);
    h.run(&mut job, &receive(RAWQ, "<wait_time>0</wait_time>", "")).await.expect("receive");
    h.run(&mut job, &envelope(ROLLBACK)).await.expect("rollback");
    assert_eq!(store.session_count().await.expect("count"), before, "rolled back: no row left");
    // A client's session that received and committed keeps its row (its positions).
    let mut client = h.session("scott");
    h.run(&mut client, &receive(RAWQ, "<wait_time>0</wait_time>", "")).await.expect("receive");
    h.run(&mut client, &envelope(COMMIT)).await.expect("commit");
    assert_eq!(store.session_count().await.expect("count"), before + 1);
}

/// A propagation batch whose receive and send share one database transaction (where the
/// store holds transactions: PostgreSQL; elsewhere the same requests take the usual two):
/// while open, its messages are taken from everyone else; its send's commit moves them all
/// at once, leaving no session row; a rollback puts every one back, not counted against it.
async fn a_job_batch_in_one_transaction_moves_all_or_nothing(b: Backend) {
    let archive = "[[queues]]\nname = \"AQUSER.RAW_ARCHIVE\"\nqueue_table = \"AQUSER.RAW_TAB\"\n";
    let h = Harness::with_topology(b, &format!("{}\n{archive}", aqgate_admin::DEFAULT_TOPOLOGY)).await;
    let store = h.engine.store().clone();
    let mut p = h.session("scott");
    let msgs: Vec<(&str, &str)> = ["01", "02", "03", "04", "05"].iter().map(|x| ("", *x)).collect();
    h.run(&mut p, &raw_send(RAWQ, &msgs, COMMIT)).await.expect("send");
    let sessions = store.session_count().await.expect("count");
    let batch = |h: &Harness| {
        let mut s = h.session("scott");
        s.propagates = true;
        s.one_transaction = true;
        s.max_messages = 3;
        s
    };
    let mut job = batch(&h);
    let r = h.run(&mut job, &receive(RAWQ, "<wait_time>0</wait_time>", "")).await.expect("receive");
    assert_eq!(received(&r).iter().map(raw_of).collect::<Vec<_>>(), ["01", "02", "03"]);
    assert_eq!(job.held.is_active(), store.holds_transactions(), "held where the store holds transactions");
    if store.holds_transactions() {
        assert_eq!(store.session_count().await.expect("count"), sessions, "a held batch writes no session row");
    }
    if store.holds_transactions() {
        // A held batch takes one receive, then its send.
        let e = h.run(&mut job, &receive(RAWQ, "<wait_time>0</wait_time>", "")).await.expect_err("a second receive");
        assert_eq!(e.0, code::INTERNAL, "{e:?}");
        let immediate = raw_send("AQUSER.RAW_ARCHIVE", &[("", "01")], "")
            .replace("</destination>", "</destination><visibility>IMMEDIATE</visibility>");
        let e = h.run(&mut job, &immediate).await.expect_err("an IMMEDIATE send");
        assert_eq!(e.0, code::INTERNAL, "{e:?}");
        assert!(job.held.is_active(), "a refused request leaves the batch as it was");
    }
    // Another consumer meanwhile gets what the batch does not hold.
    let mut other = h.session("scott");
    assert_eq!(recv_raw(&h, &mut other, "", "").await, Ok("04".into()));
    h.run(&mut other, &envelope(ROLLBACK)).await.expect("rollback");
    // (A client's session keeps its row.)
    let sessions = store.session_count().await.expect("count") - i64::from(!store.holds_transactions());
    let copies: Vec<(&str, &str)> = ["01", "02", "03"].iter().map(|x| ("", *x)).collect();
    if store.holds_transactions() {
        // A send without commit leaves the batch held, its copies unseen, for a commit
        // later; the next batch meanwhile skips the rows it removed and takes those after.
        h.run(&mut job, &raw_send("AQUSER.RAW_ARCHIVE", &copies, "")).await.expect("send without commit");
        assert!(job.held.is_active() && job.pending, "still held");
        assert_eq!(depth(&h, "AQUSER.RAW_ARCHIVE").await, 0, "the copies wait for the commit");
        let mut next = batch(&h);
        let r = h.run(&mut next, &receive(RAWQ, "<wait_time>0</wait_time>", "")).await.expect("the next batch");
        assert_eq!(received(&r).iter().map(raw_of).collect::<Vec<_>>(), ["04", "05"]);
        h.run(&mut next, &envelope(ROLLBACK)).await.expect("rollback");
        h.run(&mut job, &envelope(COMMIT)).await.expect("commit");
    } else {
        h.run(&mut job, &raw_send("AQUSER.RAW_ARCHIVE", &copies, COMMIT)).await.expect("send and commit");
    }
    assert!(!job.held.is_active(), "the commit ends the hold");
    assert!(!job.pending);
    assert_eq!(depth(&h, RAWQ).await, 2, "the three are gone from the source");
    assert_eq!(depth(&h, "AQUSER.RAW_ARCHIVE").await, 3, "and in the destination, committed together");
    assert_eq!(store.session_count().await.expect("count"), sessions, "no session row left");
    // A batch that rolls back: its messages are back, their delivery count as it was.
    let mut job = batch(&h);
    let r = h.run(&mut job, &receive(RAWQ, "<wait_time>0</wait_time>", "")).await.expect("receive");
    assert_eq!(received(&r).iter().map(raw_of).collect::<Vec<_>>(), ["04", "05"]);
    h.run(&mut job, &envelope(ROLLBACK)).await.expect("rollback");
    assert!(!job.held.is_active() && !job.pending, "the rollback ends the hold");
    assert_eq!(depth(&h, RAWQ).await, 2, "both back in the source");
    assert_eq!(depth(&h, "AQUSER.RAW_ARCHIVE").await, 3);
    let mut c = h.session("scott");
    let r = h.run(&mut c, &receive(RAWQ, "<wait_time>0</wait_time>", COMMIT)).await.expect("back in its place");
    assert_eq!(raw_of(&received(&r)[0]), "04");
    assert_eq!(
        received(&r)[0].header.delivery_count,
        Some(1),
        "counted once: the other consumer's rollback, not the job's"
    );
    if !store.holds_transactions() {
        return;
    }
    // A held batch dropped without an end (its task cancelled): the database rolls it back.
    let mut job = batch(&h);
    h.run(&mut job, &receive(RAWQ, "<wait_time>0</wait_time>", "")).await.expect("receive");
    drop(job);
    let mut c = h.session("scott");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match recv_raw(&h, &mut c, "", COMMIT).await {
            Ok(m) => {
                assert_eq!(m, "05");
                break;
            }
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("the dropped batch's message did not come back: {e:?}"),
        }
    }
}

async fn priority_queues_sort_by_priority_then_time(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    let msgs = [
        ("<priority>5</priority>", "05"),
        ("<priority>-1</priority>", "FF"),
        ("<priority>3</priority>", "03"),
        ("<priority>3</priority>", "33"),
    ];
    h.run(&mut p, &raw_send(RAWQ, &msgs, COMMIT)).await.expect("send");
    let mut c = h.session("scott");
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(recv_raw(&h, &mut c, "", COMMIT).await.expect("message"));
    }
    assert_eq!(got, ["FF", "03", "33", "05"]);
    // A message with a higher priority arriving later is not skipped by NEXT_MESSAGE.
    h.run(&mut p, &raw_send(RAWQ, &[("<priority>9</priority>", "09"), ("<priority>-5</priority>", "F5")], COMMIT))
        .await
        .expect("send");
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("F5".into()));
}

async fn selectors_by_correlation_message_id_and_condition(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    let r = h
        .run(
            &mut p,
            &raw_send(
                RAWQ,
                &[
                    ("<correlation>A1</correlation>", "01"),
                    ("<correlation>B1</correlation><priority>7</priority>", "02"),
                    ("<correlation>A2</correlation><priority>2</priority>", "03"),
                ],
                COMMIT,
            ),
        )
        .await
        .expect("send");
    let ids = sent_ids(&r);
    let mut c = h.session("scott");
    let sel = |x: &str| format!("<selector>{x}</selector>");
    assert_eq!(recv_raw(&h, &mut c, &sel("<correlation>B1</correlation>"), COMMIT).await, Ok("02".into()));
    assert_eq!(
        recv_raw(&h, &mut c, &sel(&format!("<message_id>{}</message_id>", ids[2].to_lowercase())), COMMIT).await,
        Ok("03".into())
    );
    assert_eq!(
        recv_raw(&h, &mut c, &sel(&format!("<message_id>{}</message_id>", ids[2])), COMMIT).await,
        Err(code::NO_SUCH_MESSAGE_ID)
    );
    h.run(&mut p, &raw_send(RAWQ, &[("<correlation>A3</correlation><priority>4</priority>", "04")], COMMIT))
        .await
        .expect("send");
    assert_eq!(
        recv_raw(&h, &mut c, &sel("<condition>corrid LIKE 'A%' AND priority &gt; 3</condition>"), COMMIT).await,
        Ok("04".into())
    );
    assert_eq!(recv_raw(&h, &mut c, &sel("<condition>priority &gt; 100</condition>"), "").await, Err(code::NO_MESSAGE));
    assert_eq!(
        recv_raw(&h, &mut c, &sel("<condition>1=1; DROP TABLE messages</condition>"), "").await,
        Err(code::BAD_CONDITION)
    );
    assert_eq!(
        recv_raw(&h, &mut c, &sel("<condition>priority = (SELECT 1)</condition>"), "").await,
        Err(code::BAD_CONDITION)
    );
    assert_eq!(depth(&h, RAWQ).await, 1, "A1 is still there: nothing was harmed");
}

const TOPIC: &str = "AQUSER.EMP_TOPIC";

fn publish_emp(deptno: u32, header: &str, extra: &str) -> String {
    envelope(&format!(
        r#"<AQXmlPublish xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{TOPIC}</destination></producer_options>
        <message_set><message_count>1</message_count><message><message_number>1</message_number><message_header>{header}</message_header>
        <message_payload><EMP_TYP><EMPNO>1111</EMPNO><ENAME>Mary</ENAME><DEPTNO>{deptno}</DEPTNO></EMP_TYP></message_payload></message></message_set>{extra}</AQXmlPublish>"#
    ))
}

fn emp_receive(consumer: &str, opts: &str) -> String {
    receive(TOPIC, &format!("<consumer_name>{consumer}</consumer_name><wait_time>0</wait_time>{opts}"), COMMIT)
}

fn deptno_of(r: &Response) -> String {
    received(r)[0].payload.child("DEPTNO").map(|d| d.text()).unwrap_or_default()
}

async fn multi_consumer_fan_out_and_recipient_lists(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &publish_emp(10, "", COMMIT)).await.expect("publish to subscribers");
    h.run(
        &mut p,
        &publish_emp(20, "<recipient_list><recipient><agent_name>APP2</agent_name></recipient><recipient><agent_name>app1</agent_name></recipient></recipient_list>", COMMIT),
    )
    .await
    .expect("publish to a recipient list");
    h.run(
        &mut p,
        &publish_emp(
            30,
            "<recipient_list><recipient><agent_name>APP2</agent_name></recipient></recipient_list>",
            COMMIT,
        ),
    )
    .await
    .expect("publish to APP2 only");
    assert_eq!(depth(&h, TOPIC).await, 3);
    let mut c = h.session("scott");
    assert_eq!(deptno_of(&h.run(&mut c, &emp_receive("APP1", "")).await.expect("1")), "10");
    assert_eq!(deptno_of(&h.run(&mut c, &emp_receive("APP1", "")).await.expect("2")), "20");
    assert_eq!(fault_code(h.run(&mut c, &emp_receive("APP1", "")).await), code::NO_MESSAGE);
    assert_eq!(depth(&h, TOPIC).await, 2, "message 10 had only APP1 and is gone");
    assert_eq!(deptno_of(&h.run(&mut c, &emp_receive("app2", "")).await.expect("3")), "20");
    assert_eq!(deptno_of(&h.run(&mut c, &emp_receive("APP2", "")).await.expect("4")), "30");
    assert_eq!(depth(&h, TOPIC).await, 0, "every consumer removed every message");
}

async fn consumer_name_rules(b: Backend) {
    let h = Harness::new(b).await;
    let mut c = h.session("scott");
    assert_eq!(
        fault_code(h.run(&mut c, &receive(TOPIC, "<wait_time>0</wait_time>", "")).await),
        code::CONSUMER_REQUIRED
    );
    assert_eq!(
        fault_code(
            h.run(&mut c, &receive(RAWQ, "<consumer_name>APP1</consumer_name><wait_time>0</wait_time>", "")).await
        ),
        code::NOT_MULTI_CONSUMER
    );
    assert_eq!(
        fault_code(
            h.run(
                &mut c,
                &raw_send(
                    RAWQ,
                    &[("<recipient_list><recipient><agent_name>X</agent_name></recipient></recipient_list>", "01")],
                    ""
                )
            )
            .await
        ),
        code::NOT_MULTI_CONSUMER
    );
    assert_eq!(
        fault_code(h.run(&mut c, &receive("AQUSER.NO_SUCH_QUEUE", "<wait_time>0</wait_time>", "")).await),
        code::NO_SUCH_QUEUE
    );
}

async fn later_subscribers_see_only_later_messages(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &publish_emp(10, "", COMMIT)).await.expect("publish");
    let topo =
        format!("{}\n[[subscribers]]\nqueue = \"AQUSER.EMP_TOPIC\"\nname = \"LATE\"\n", aqgate_admin::DEFAULT_TOPOLOGY);
    let t = aqgate_core::topology::Topology::from_toml(&topo).expect("topology");
    let changes = aqgate_admin::apply(h.engine.store().as_ref(), &t, false).await.expect("apply");
    assert_eq!(changes.len(), 1, "{changes:?}");
    h.engine.reload().await.expect("reload");
    h.run(&mut p, &publish_emp(20, "", COMMIT)).await.expect("publish");
    let mut c = h.session("scott");
    assert_eq!(deptno_of(&h.run(&mut c, &emp_receive("LATE", "")).await.expect("late")), "20");
    assert_eq!(fault_code(h.run(&mut c, &emp_receive("LATE", "")).await), code::NO_MESSAGE);
    assert_eq!(deptno_of(&h.run(&mut c, &emp_receive("APP1", "")).await.expect("app1")), "10");
}

async fn delayed_messages_wait(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("<delay>10</delay>", "01")], COMMIT)).await.expect("send");
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", "").await, Err(code::NO_MESSAGE));
    h.clock.advance_secs(9);
    assert_eq!(recv_raw(&h, &mut c, "", "").await, Err(code::NO_MESSAGE));
    h.clock.advance_secs(2);
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("01".into()));
}

async fn expired_messages_move_to_the_exception_queue(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    // Expiration counts from the end of the delay: visible at 5 s, expired at 5 + 3 s.
    h.run(
        &mut p,
        &raw_send(
            RAWQ,
            &[("<delay>5</delay><expiration>3</expiration><correlation>X</correlation>", "01"), ("", "02")],
            COMMIT,
        ),
    )
    .await
    .expect("send");
    h.clock.advance_secs(7);
    assert_eq!(h.engine.expire_messages().await.expect("tm"), 0);
    h.clock.advance_secs(2);
    assert_eq!(h.engine.expire_messages().await.expect("tm"), 1);
    let eq = "AQUSER.AQ$_RAW_TAB_E";
    assert_eq!(depth(&h, eq).await, 1);
    let mut c = h.session("scott");
    let r = h.run(&mut c, &receive(eq, "<wait_time>0</wait_time>", COMMIT)).await.expect("from exception queue");
    let m = &received(&r)[0];
    assert_eq!(m.header.message_state, Some(3));
    assert_eq!(m.header.correlation.as_deref(), Some("X"));
    assert_eq!(raw_of(m), "01");
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("02".into()));
}

/// The time manager reads the due messages, then moves them: a consumer that locks one in
/// between (its dequeue began before the expiry) keeps it, and its commit removes it.
async fn a_message_locked_while_expiring_stays_with_its_consumer(b: Backend) {
    use aqgate_core::store::LockKind;
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("<expiration>3</expiration>", "01")], COMMIT)).await.expect("send");
    h.clock.advance_secs(5);
    let store = h.engine.store();
    let due = store.due_expirations(h.clock.now(), 10).await.expect("due");
    assert_eq!(due.len(), 1);
    let mut tx = store.begin().await.expect("begin");
    assert!(tx.lock(due[0].seq, "", "consumer-txn", LockKind::Remove).await.expect("lock"));
    tx.commit().await.expect("commit the lock");
    let ids: std::collections::HashMap<String, i64> = store.queue_ids().await.expect("ids").into_iter().collect();
    let mut tx = store.begin().await.expect("begin");
    tx.move_to_exception(due[0].seq, ids["AQUSER.AQ$_RAW_TAB_E"], false, aqgate_core::store::Expiry::Time)
        .await
        .expect("move");
    tx.commit().await.expect("commit the move");
    assert_eq!((depth(&h, RAWQ).await, depth(&h, "AQUSER.AQ$_RAW_TAB_E").await), (1, 0), "not moved");
    let mut tx = store.begin().await.expect("begin");
    tx.commit_session("consumer-txn", true).await.expect("the consumer commits");
    tx.commit().await.expect("commit");
    assert_eq!((depth(&h, RAWQ).await, depth(&h, "AQUSER.AQ$_RAW_TAB_E").await), (0, 0), "removed by its consumer");
}

async fn a_request_is_all_or_nothing(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    let r = h.run(&mut p, &raw_send(RAWQ, &[("", "01"), ("", "02"), ("", "XYZ")], COMMIT)).await;
    let (c, msg) = r.expect_err("third message is invalid");
    assert_eq!(c, code::PAYLOAD_MISMATCH);
    assert!(msg.contains("message 3"), "{msg}");
    let r = h.run(&mut p, &publish_emp(100, "", COMMIT)).await;
    assert_eq!(fault_code(r), code::PAYLOAD_MISMATCH, "DEPTNO is NUMBER(2)");
    assert_eq!(depth(&h, RAWQ).await, 0);
    assert_eq!(depth(&h, TOPIC).await, 0);
}

/// Concurrent committed sends (which PostgreSQL writes together, several requests per
/// statement) each get their own messages, all stored, none twice.
async fn concurrent_senders_are_all_stored(b: Backend) {
    let h = std::sync::Arc::new(Harness::new(b).await);
    let mut tasks = Vec::new();
    for t in 0..8 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = h.session("scott");
            let mut ids = Vec::new();
            for i in 0..20 {
                let r = h.run(&mut s, &raw_send(RAWQ, &[("", &format!("{t:02X}{i:02X}"))], COMMIT)).await;
                ids.extend(sent_ids(&r.expect("send")));
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.expect("task"));
    }
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!((n, ids.len()), (160, 160), "every send got its own message id");
    assert_eq!(depth(&h, RAWQ).await, 160);
    let mut s = h.session("scott");
    let mut got = Vec::new();
    while let Ok(x) = recv_raw(&h, &mut s, "", COMMIT).await {
        got.push(x);
    }
    got.sort();
    let mut want: Vec<String> = (0..8).flat_map(|t| (0..20).map(move |i| format!("{t:02X}{i:02X}"))).collect();
    want.sort();
    assert_eq!(got, want);
}

async fn two_consumers_never_remove_the_same_message(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    let msgs: Vec<(String, String)> = (0..40).map(|i| (String::new(), format!("{i:04X}"))).collect();
    let refs: Vec<(&str, &str)> = msgs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    h.run(&mut p, &raw_send(RAWQ, &refs, COMMIT)).await.expect("send");
    let h = std::sync::Arc::new(h);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = h.session("scott");
            let mut got = Vec::new();
            while let Ok(x) = recv_raw(&h, &mut s, "", COMMIT).await {
                got.push(x);
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    all.sort();
    let mut want: Vec<String> = msgs.into_iter().map(|(_, b)| b).collect();
    want.sort();
    assert_eq!(all, want, "each message removed exactly once");
}

/// A new process on the same database (a restart, or another node) continues the open
/// sessions of the old one: their uncommitted work and their locks stay, and their commit
/// publishes it.
async fn a_restart_keeps_open_sessions(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01")], COMMIT)).await.expect("committed");
    h.run(&mut p, &raw_send(RAWQ, &[("", "02")], "")).await.expect("open");
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", "").await, Ok("01".into()), "locked by an open remove");
    let store = aqgate_store::open(&h.url).await.expect("reopen");
    let clock = h.clock.clone() as std::sync::Arc<dyn aqgate_core::clock::Clock>;
    let e2 = aqgate_core::engine::Engine::start(store, clock, Default::default()).await.expect("restart");
    let exec = |s: &mut aqgate_core::engine::Session, xml: String| {
        let req = aqgate_proto::idap::parse_request(xml.as_bytes(), &Default::default()).expect("parse").body;
        let e2 = e2.clone();
        let mut taken = std::mem::replace(s, aqgate_core::engine::Session::new("SCOTT", 0));
        async move {
            let r = e2.execute(&mut taken, req).await;
            (taken, r)
        }
    };
    let recv = receive(RAWQ, "<wait_time>0</wait_time>", COMMIT);
    let mut other = aqgate_core::engine::Session::new("SCOTT", 0);
    let (o, r) = exec(&mut other, recv.clone()).await;
    other = o;
    assert_eq!(r.expect_err("01 is locked, 02 not committed").code, code::NO_MESSAGE);
    for (old, what) in [(&p, "the producer"), (&c, "the consumer")] {
        let mut s = match e2.resume(&old.id).await.expect("resume") {
            aqgate_core::engine::Resumed::Live(s) => s,
            r => panic!("{what}'s session is not live after the restart: {r:?}"),
        };
        assert!(s.pending, "{what}'s work is still open");
        let (_, r) = exec(&mut s, envelope(COMMIT)).await;
        r.expect("commits after the restart");
    }
    let (o, r) = exec(&mut other, recv.clone()).await;
    other = o;
    assert_eq!(raw_of(&received(&r.expect("02 was published"))[0]), "02");
    let (_, r) = exec(&mut other, recv).await;
    assert_eq!(r.expect_err("01 was removed by the consumer's commit").code, code::NO_MESSAGE);
}

/// Deletes the session row of `s` (as if it had never been written): its uncommitted work
/// is then an orphan that recovery rolls back.
async fn orphan(h: &Harness, s: &aqgate_core::engine::Session) {
    let mut tx = h.engine.store().begin().await.expect("begin");
    assert!(tx.session_end(&s.id_hash(), s.stored.expect("stored"), None, None).await.expect("end"));
    tx.commit().await.expect("commit");
}

/// Uncommitted rows that no stored session owns (a process that died mid-way through an
/// older version) are rolled back at start; a stored session's rows are not.
async fn recovery_rolls_back_only_what_no_session_owns(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01")], "")).await.expect("open, owned");
    let mut orphan = h.session("scott");
    h.run(&mut orphan, &raw_send(RAWQ, &[("", "02")], "")).await.expect("open");
    self::orphan(&h, &orphan).await;
    assert_eq!(h.engine.store().recover().await.expect("recover"), 1, "the orphan's one row");
    h.run(&mut p, &envelope(COMMIT)).await.expect("the owned work commits");
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("01".into()));
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Err(code::NO_MESSAGE), "02 was rolled back");
}

/// An idle session is rolled back once, by whichever process finds it first; it leaves a
/// tombstone that says so until its time is up.
async fn idle_sessions_roll_back(b: Backend) {
    let h = Harness::new(b).await;
    let mut s = h.session("scott");
    h.run(&mut s, &raw_send(RAWQ, &[("", "01")], "")).await.expect("open");
    let store = aqgate_store::open(&h.url).await.expect("a second process");
    let clock = h.clock.clone() as std::sync::Arc<dyn aqgate_core::clock::Clock>;
    let e2 = aqgate_core::engine::Engine::attach(store, clock, Default::default()).await.expect("attach");
    h.clock.advance_secs(10);
    assert_eq!(h.engine.expire_sessions().await, 0, "not idle long enough");
    h.clock.advance_secs(600);
    let (a, b2) = tokio::join!(h.engine.expire_sessions(), e2.expire_sessions());
    assert_eq!(a + b2, 1, "rolled back exactly once");
    assert!(matches!(
        h.engine.resume(&s.id).await.expect("resume"),
        aqgate_core::engine::Resumed::Ended { had_work: true, .. }
    ));
    let (c, _) = h.run(&mut s, &envelope(COMMIT)).await.expect_err("a stale copy of the session cannot commit");
    assert_eq!(c, code::SESSION_EXPIRED);
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", "").await, Err(code::NO_MESSAGE));
    h.clock.advance_secs(2 * 86_400);
    h.engine.purge_sessions().await;
    assert!(matches!(h.engine.resume(&s.id).await.expect("resume"), aqgate_core::engine::Resumed::Unknown));
}

/// An idempotency record is unique per (agent, key), and forgotten once the window is over.
async fn idempotency_records_are_per_agent_and_kept_for_the_window(b: Backend) {
    let h = Harness::new(b).await;
    let store = h.engine.store();
    let rec = aqgate_core::store::IdempotencyRecord {
        agent: "SCOTT".into(),
        key: "order-1".into(),
        request_hash: vec![7; 32],
        response: b"<Envelope/>".to_vec(),
        created_at: T0,
    };
    let mut tx = store.begin().await.expect("begin");
    assert!(tx.idempotency_put(&rec).await.expect("put"));
    assert!(!tx.idempotency_put(&rec).await.expect("put again"), "the key is taken");
    tx.commit().await.expect("commit");
    assert_eq!(store.idempotency_get("SCOTT", "order-1").await.expect("get"), Some(rec.clone()));
    assert_eq!(store.idempotency_get("JOHN", "order-1").await.expect("get"), None, "keys are per agent");
    store.sessions_purge(T0, T0).await.expect("purge");
    assert!(store.idempotency_get("SCOTT", "order-1").await.expect("get").is_some(), "inside the window");
    assert_eq!(store.sessions_purge(T0, T0 + 1).await.expect("purge"), 1);
    assert_eq!(store.idempotency_get("SCOTT", "order-1").await.expect("get"), None, "the window is over");
}

/// A SAML assertion id is accepted once per issuer, by every process of the store, and
/// forgotten by the purge once its time is up (a replay then fails its validity anyway).
async fn saml_assertion_ids_are_used_once_until_purged(b: Backend) {
    let h = Harness::new(b).await;
    let store = h.engine.store();
    let other = aqgate_store::open(&h.url).await.expect("a second process");
    assert!(store.saml_assertion_once("https://idp.example", "_a1", T0 + 10).await.expect("first"));
    assert!(!other.saml_assertion_once("https://idp.example", "_a1", T0 + 10).await.expect("replay"), "seen");
    assert!(other.saml_assertion_once("https://other-idp.example", "_a1", T0 + 10).await.expect("other issuer"));
    let (x, y) = tokio::join!(
        store.saml_assertion_once("https://idp.example", "_a2", T0 + 10),
        other.saml_assertion_once("https://idp.example", "_a2", T0 + 10)
    );
    assert!(x.expect("x") ^ y.expect("y"), "exactly one of two concurrent uses wins");
    assert_eq!(store.sessions_purge(T0 + 9, T0).await.expect("purge"), 0, "still remembered");
    assert!(!store.saml_assertion_once("https://idp.example", "_a1", T0 + 10).await.expect("replay"));
    assert_eq!(store.sessions_purge(T0 + 10, T0).await.expect("purge"), 3, "time is up");
    assert!(store.saml_assertion_once("https://idp.example", "_a1", T0 + 20).await.expect("forgotten"));
}

/// Two requests of one session in two processes at once: the one that writes second
/// finds the session changed and is rolled back entirely (the client sends it again).
async fn a_session_changed_meanwhile_refuses_the_stale_request(b: Backend) {
    let h = Harness::new(b).await;
    let mut s = h.session("scott");
    h.run(&mut s, &raw_send(RAWQ, &[("", "01")], "")).await.expect("open");
    let mut stale = match h.engine.resume(&s.id).await.expect("resume") {
        aqgate_core::engine::Resumed::Live(x) => x,
        r => panic!("{r:?}"),
    };
    h.run(&mut s, &raw_send(RAWQ, &[("", "02")], "")).await.expect("the other node's request");
    let (c, _) = h.run(&mut stale, &raw_send(RAWQ, &[("", "03")], COMMIT)).await.expect_err("stale");
    assert_eq!(c, code::SESSION_BUSY);
    let mut fresh = match h.engine.resume(&s.id).await.expect("resume") {
        aqgate_core::engine::Resumed::Live(x) => x,
        r => panic!("{r:?}"),
    };
    assert_eq!(fresh.enqueued, 2);
    h.run(&mut fresh, &envelope(COMMIT)).await.expect("commit");
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("01".into()));
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("02".into()));
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Err(code::NO_MESSAGE), "03 was not performed");
    // A stale copy whose request would succeed on its own terms (no count to disagree
    // with): the session write finds the newer version and the send is undone.
    let mut s = h.session("scott");
    h.run(&mut s, &raw_send(RAWQ, &[("", "04")], "")).await.expect("open");
    let mut stale = match h.engine.resume(&s.id).await.expect("resume") {
        aqgate_core::engine::Resumed::Live(x) => x,
        r => panic!("{r:?}"),
    };
    h.run(&mut s, &envelope(COMMIT)).await.expect("committed through the other node");
    let (c2, _) = h.run(&mut stale, &raw_send(RAWQ, &[("", "05")], "")).await.expect_err("stale send");
    assert_eq!(c2, code::SESSION_BUSY);
    let (c2, _) = h.run(&mut stale, &envelope(ROLLBACK)).await.expect_err("stale rollback");
    assert_eq!(c2, code::SESSION_BUSY, "a stale rollback must not undo the commit");
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("04".into()));
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Err(code::NO_MESSAGE), "05 was not performed");
}

async fn adt_payload_round_trips_examples(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    let r = h.run(&mut p, &example("01")).await.expect("example 01");
    assert!(matches!(&r, Response::Send(_, Some(res)) if res.destination == "QS.NEW_ORDERS_QUE"));
    h.run(&mut p, &example("10")).await.expect("example 10 commits");
    let r = h.run(&mut p, &example("08")).await.expect("example 08 browses");
    let m = &received(&r)[0];
    assert_eq!(m.header.correlation.as_deref(), Some("HLB-4471"));
    assert_eq!(m.header.sender_id.as_ref().and_then(|s| s.name.as_deref()), Some("scott"));
    let city = m.payload.child("CUSTOMER").and_then(|c| c.child("CITY")).map(|c| c.text());
    assert_eq!(city.as_deref(), Some("PORTLAND"));
    assert_eq!(m.payload.child("ITEMS").map(|i| i.elements().count()), Some(3));
    let r = h.run(&mut p, &example("07")).await.expect("example 07 receives and commits");
    assert_eq!(received(&r)[0].header.message_id, m.header.message_id);
    assert_eq!(fault_code(h.run(&mut p, &example("05")).await), code::NO_MESSAGE);
}

async fn privileges_are_enforced(b: Backend) {
    let h = Harness::new(b).await;
    let mut john = h.session("john");
    // john (users OE, AQUSER) may enqueue to QS's queue through a grant (as himself, the
    // sender), but not dequeue.
    let as_john = example("01").replace("<agent_name>scott</agent_name>", "<agent_name>john</agent_name>");
    h.run(&mut john, &as_john).await.expect("granted enqueue");
    assert_eq!(fault_code(h.run(&mut john, &example("05")).await), code::NOT_PERMITTED);
    let mut scott = h.session("scott");
    h.run(&mut scott, &example("16").replace("john", "scott")).await.expect_err("scott may not enqueue to OE's queue");
    let r = h.run(&mut scott, &example("16")).await;
    assert_eq!(fault_code(r), code::NOT_PERMITTED);
    h.run(&mut john, &example("16")).await.expect("OE owns OE.OE_NEW_ORDERS_QUE");
    h.run(&mut john, &envelope(COMMIT)).await.expect("commit");
    let r = h
        .run(&mut scott, &receive("OE.OE_NEW_ORDERS_QUE", "<wait_time>0</wait_time>", COMMIT))
        .await
        .expect("granted dequeue");
    assert_eq!(received(&r)[0].header.correlation.as_deref(), Some("WEB-CART-5520"));
}

fn register(dest: &str, consumer: &str, url: &str) -> String {
    let consumer =
        if consumer.is_empty() { String::new() } else { format!("<consumer_name>{consumer}</consumer_name>") };
    envelope(&format!(
        r#"<AQXmlRegister xmlns="http://ns.oracle.com/AQ/schemas/access"><register_options><destination>{dest}</destination>{consumer}<notify_url>{url}</notify_url></register_options><AQXmlCommit/></AQXmlRegister>"#
    ))
}

async fn registrations(b: Backend) {
    let mail = aqgate_core::notify_policy::MailPolicy::parse(&["example.com"]).expect("mail policy");
    let config = aqgate_core::engine::EngineConfig {
        notify_mail_policy: std::sync::Arc::new(mail),
        ..aqgate_core::engine::EngineConfig::default()
    };
    let h = Harness::with_config(b, aqgate_admin::DEFAULT_TOPOLOGY, config).await;
    let mut s = h.session("scott");
    let reg = |url: &str| register("AQUSER.EMP_TOPIC", "APP1", url);
    assert!(matches!(h.run(&mut s, &reg("mailto:app1@example.com")).await, Ok(Response::Register(_))));
    // Registering again (same queue, consumer, agent) replaces the URL.
    assert!(matches!(h.run(&mut s, &reg("http://93.184.216.34/notify")).await, Ok(Response::Register(_))));
    let qid = h.engine.resolved().ids["AQUSER.EMP_TOPIC"];
    let regs = h.engine.store().registrations(qid).await.expect("registrations");
    assert_eq!(regs.len(), 1, "{regs:?}");
    assert_eq!((regs[0].consumer.as_str(), regs[0].agent.as_str()), ("APP1", "SCOTT"));
    assert_eq!(regs[0].notify_url, "http://93.184.216.34/notify");
    // Another agent's registration is its own.
    let mut j = h.session("john");
    let r = h.run(&mut j, &reg("mailto:john@example.com")).await;
    assert!(matches!(r, Ok(Response::Register(_))), "{r:?}");
    let regs = h.engine.store().registrations(qid).await.expect("registrations");
    assert_eq!(regs.iter().map(|r| r.agent.as_str()).collect::<Vec<_>>(), ["JOHN", "SCOTT"]);
    // Refused: loopback and private targets (no allow rule), credentials in the URL,
    // other schemes, a placeholder instead of an address, a bad address.
    assert_eq!(fault_code(h.run(&mut s, &reg("http://127.0.0.1:9/notify")).await), code::NOT_PERMITTED);
    assert_eq!(fault_code(h.run(&mut s, &reg("http://localhost/notify")).await), code::NOT_PERMITTED);
    assert_eq!(fault_code(h.run(&mut s, &reg("https://169.254.169.254/latest")).await), code::NOT_PERMITTED);
    assert_eq!(fault_code(h.run(&mut s, &reg("http://[::ffff:10.0.0.1]/x")).await), code::NOT_PERMITTED);
    for v6 in ["[::127.0.0.1]", "[::a9fe:a9fe]", "[::ffff:0:7f00:1]", "[64:ff9b::a9fe:a9fe]", "[2002:a00:1::1]"] {
        let r = h.run(&mut s, &reg(&format!("http://{v6}/x"))).await;
        assert_eq!(fault_code(r), code::NOT_PERMITTED, "{v6}");
    }
    // mailto: addresses outside the allowed domain (example.com here).
    let r = h.run(&mut s, &reg("mailto:someone@elsewhere.test")).await;
    assert!(matches!(&r, Err((c, m)) if *c == code::NOT_PERMITTED && m.contains("--notify-mail-allow")), "{r:?}");
    assert_eq!(fault_code(h.run(&mut s, &reg("mailto:a@sub.example.com")).await), code::NOT_PERMITTED);
    assert_eq!(fault_code(h.run(&mut s, &reg("https://user:pw@93.184.216.34/x")).await), code::INVALID_VALUE);
    assert_eq!(fault_code(h.run(&mut s, &reg("plsql://aq.notify_proc")).await), code::INVALID_VALUE);
    assert_eq!(fault_code(h.run(&mut s, &reg("ftp://x")).await), code::INVALID_VALUE);
    assert_eq!(fault_code(h.run(&mut s, &reg("mailto:a@@b")).await), code::INVALID_VALUE);
    assert_eq!(
        fault_code(h.run(&mut s, &example("09").replace("hr-events@example.com", "[e-mail]")).await),
        code::INVALID_VALUE,
        "mailto:[e-mail] is a placeholder"
    );
    // An alias needs the directory (none here).
    assert_eq!(fault_code(h.run(&mut s, &reg("mailto:ORDERS_DESK")).await), code::DIRECTORY);
    // A refused registration changed nothing.
    let regs = h.engine.store().registrations(qid).await.expect("registrations");
    assert!(regs.iter().any(|r| r.agent == "SCOTT" && r.notify_url == "http://93.184.216.34/notify"));
    // The documented unregister form: an empty notify_url.
    assert!(matches!(h.run(&mut s, &reg("")).await, Ok(Response::Register(_))));
    let regs = h.engine.store().registrations(qid).await.expect("registrations");
    assert!(regs.iter().all(|r| r.agent != "SCOTT"), "{regs:?}");
    assert!(matches!(h.run(&mut s, &reg("")).await, Ok(Response::Register(_))), "unregistering twice is fine");
}

async fn notification_aliases_resolve_through_the_directory(b: Backend) {
    let h = Harness::with_directory(b).await;
    let mut s = h.session("scott");
    let r = h.run(&mut s, &register("AQUSER.EMP_TOPIC", "APP1", "mailto:ORDERS_DESK")).await;
    assert!(matches!(r, Ok(Response::Register(_))), "{r:?}");
    let r = h.run(&mut s, &register("AQUSER.EMP_TOPIC", "APP1", "mailto:NO_SUCH_ALIAS")).await;
    assert_eq!(fault_code(r), code::DIRECTORY);
    // By default an address must be a mailbox of the directory (john's is); others are
    // refused, whatever their domain.
    let r = h.run(&mut s, &register("AQUSER.EMP_TOPIC", "APP1", "mailto:John@Example.com")).await;
    assert!(matches!(r, Ok(Response::Register(_))), "{r:?}");
    let r = h.run(&mut s, &register("AQUSER.EMP_TOPIC", "APP1", "mailto:hr-events@example.com")).await;
    assert!(matches!(&r, Err((c, m)) if *c == code::NOT_PERMITTED && m.contains("directory")), "{r:?}");
}

/// Outbox entries due now (claimed with a lease of 60 s).
async fn claim(h: &Harness) -> Vec<aqgate_core::store::OutboxEntry> {
    let now = h.clock.now();
    h.engine.store().notify_claim(now, now + 60_000_000, 100, &Default::default()).await.expect("claim")
}

async fn notification_outbox_is_transactional(b: Backend) {
    let h = Harness::new(b).await;
    let mut s = h.session("scott");
    h.run(&mut s, &register(RAWQ, "", "http://93.184.216.34/hook")).await.expect("register");
    // ON_COMMIT work: no notification until it commits; none at all when rolled back.
    h.run(&mut s, &raw_send(RAWQ, &[("", "01")], "")).await.expect("open send");
    assert!(claim(&h).await.is_empty(), "uncommitted enqueue must not notify");
    assert_eq!(h.engine.store().notify_counts().await.expect("counts"), (0, 0));
    h.run(&mut s, &envelope(ROLLBACK)).await.expect("rollback");
    assert!(claim(&h).await.is_empty(), "rolled-back enqueue notifies nobody");
    let sent =
        sent_ids(&h.run(&mut s, &raw_send(RAWQ, &[("<correlation>C1</correlation>", "02")], "")).await.expect("send"));
    assert!(claim(&h).await.is_empty());
    h.run(&mut s, &envelope(COMMIT)).await.expect("commit");
    let got = claim(&h).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let e = &got[0];
    assert_eq!(hex::encode_upper(e.msgid), sent[0]);
    assert_eq!((e.consumer.as_str(), e.agent.as_str(), e.corrid.as_deref()), ("", "SCOTT", Some("C1")));
    assert_eq!(e.notify_url, "http://93.184.216.34/hook");
    assert_eq!(e.attempts, 1);
    assert!(e.notification_id().starts_with(&sent[0]));
    // Claimed: leased, not handed out again until the lease ends.
    assert!(claim(&h).await.is_empty());
    h.clock.advance_secs(61);
    let again = claim(&h).await;
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id, again[0].attempts), (e.id, 2), "same notification, same id, one more attempt");
    h.engine.store().notify_delivered(&[e.id]).await.expect("delivered");
    h.clock.advance_secs(120);
    assert!(claim(&h).await.is_empty(), "delivered notifications are gone");
    // A committed message_set of three, and an IMMEDIATE send: one notification each.
    h.run(&mut s, &raw_send(RAWQ, &[("", "03"), ("", "04"), ("", "05")], COMMIT)).await.expect("set");
    let imm =
        raw_send(RAWQ, &[("", "06")], "").replace("</destination>", "</destination><visibility>IMMEDIATE</visibility>");
    h.run(&mut s, &imm).await.expect("immediate");
    assert_eq!(claim(&h).await.len(), 4);
    // The consumer taking the message first does not cancel its notification: the
    // properties were copied.
    h.run(&mut s, &raw_send(RAWQ, &[("<correlation>GONE</correlation>", "07")], COMMIT)).await.expect("send");
    recv_raw(&h, &mut s, "", COMMIT).await.expect("receive");
    let got = claim(&h).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].corrid.as_deref(), Some("GONE"));
}

async fn notification_outbox_survives_restart_with_its_session(b: Backend) {
    let h = Harness::new(b).await;
    let mut s = h.session("scott");
    h.run(&mut s, &register(RAWQ, "", "http://93.184.216.34/hook")).await.expect("register");
    h.run(&mut s, &raw_send(RAWQ, &[("", "01")], COMMIT)).await.expect("committed");
    h.run(&mut s, &raw_send(RAWQ, &[("", "02")], "")).await.expect("open");
    // A new process: the committed notification is still owed; the open one is not due
    // until the session, continued there, commits.
    let store = aqgate_store::open(&h.url).await.expect("reopen");
    let clock = h.clock.clone() as std::sync::Arc<dyn aqgate_core::clock::Clock>;
    let e2 = aqgate_core::engine::Engine::start(store.clone(), clock, Default::default()).await.expect("restart");
    let now = h.clock.now();
    let got = e2.store().notify_claim(now, now + 1, 100, &Default::default()).await.expect("claim");
    assert_eq!(got.len(), 1, "{got:?}");
    let aqgate_core::engine::Resumed::Live(mut s2) = e2.resume(&s.id).await.expect("resume") else {
        panic!("the session survives the restart")
    };
    let req = aqgate_proto::idap::parse_request(envelope(COMMIT).as_bytes(), &Default::default()).expect("parse").body;
    e2.execute(&mut s2, req).await.expect("commit");
    let got = e2.store().notify_claim(now, now + 1, 100, &Default::default()).await.expect("claim");
    assert_eq!(got.len(), 1, "the committed send's notification: {got:?}");
}

async fn notification_retries_park_and_unpark(b: Backend) {
    let h = Harness::new(b).await;
    let store = h.engine.store().clone();
    let mut s = h.session("scott");
    h.run(&mut s, &register(RAWQ, "", "http://93.184.216.34/hook")).await.expect("register");
    let qid = h.engine.resolved().ids[RAWQ];
    assert!(store.set_registration_secret(qid, "", "SCOTT", Some("s3cret")).await.expect("secret"));
    assert!(!store.set_registration_secret(qid, "", "JOHN", Some("x")).await.expect("no such registration"));
    h.run(&mut s, &raw_send(RAWQ, &[("", "01")], COMMIT)).await.expect("send");
    let e = claim(&h).await.pop().expect("one due");
    assert_eq!(e.secret.as_deref(), Some("s3cret"));
    assert!(!format!("{e:?}").contains("s3cret"), "secrets stay out of Debug output");
    let later = h.clock.now() + 5_000_000;
    store.notify_failed(e.id, "HTTP 503", Some(later)).await.expect("failed");
    assert_eq!(store.notify_next_due(&[]).await.expect("next"), Some(later));
    assert!(claim(&h).await.is_empty(), "not due before its retry time");
    h.clock.advance_secs(5);
    let e = claim(&h).await.pop().expect("due again");
    assert_eq!(e.attempts, 2);
    store.notify_failed(e.id, "HTTP 500", None).await.expect("park");
    assert_eq!(store.notify_counts().await.expect("counts"), (0, 1));
    let pending = store.notify_pending(10).await.expect("pending");
    assert_eq!((pending[0].state.as_str(), pending[0].last_error.as_deref()), ("parked", Some("HTTP 500")));
    h.clock.advance_secs(3600);
    assert!(claim(&h).await.is_empty(), "parked notifications wait for an operator");
    assert_eq!(store.notify_unpark(h.clock.now()).await.expect("unpark"), 1);
    let e = claim(&h).await.pop().expect("back in line");
    assert_eq!(e.attempts, 1);
    store.notify_delivered(&[e.id]).await.expect("delivered");
    assert_eq!(store.notify_counts().await.expect("counts"), (0, 0));
    // Delayed messages notify when they become visible.
    h.run(&mut s, &raw_send(RAWQ, &[("<delay>10</delay>", "02")], COMMIT)).await.expect("delayed");
    assert!(claim(&h).await.is_empty());
    assert_eq!(store.notify_next_due(&[]).await.expect("next"), Some(h.clock.now() + 10_000_000));
    // Unregistering drops what is still owed.
    h.run(&mut s, &register(RAWQ, "", "")).await.expect("unregister");
    assert_eq!(store.notify_next_due(&[]).await.expect("next"), None);
}

async fn notification_claims_are_shaped_per_target(b: Backend) {
    use aqgate_core::store::ClaimShape;
    let h = Harness::new(b).await;
    let store = h.engine.store().clone();
    let (slow, quick) = ("http://93.184.216.34/slow".to_string(), "http://93.184.216.35/quick".to_string());
    let mut s = h.session("scott");
    h.run(&mut s, &register(RAWQ, "", &slow)).await.expect("register scott");
    let mut j = h.session("john");
    h.run(&mut j, &register(RAWQ, "", &quick)).await.expect("register john");
    for i in 0..5 {
        h.run(&mut s, &raw_send(RAWQ, &[("", &format!("{i:02X}"))], COMMIT)).await.expect("send");
    }
    let now = h.clock.now();
    let lease = now + 60_000_000;
    let take = |shape: ClaimShape| {
        let (store, now) = (store.clone(), h.clock.now());
        async move { store.notify_claim(now, lease, 100, &shape).await.expect("claim") }
    };
    let urls = |v: &[aqgate_core::store::OutboxEntry]| v.iter().map(|e| e.notify_url.clone()).collect::<Vec<_>>();
    // At most two per URL: both targets get their share, the oldest first.
    let got = take(ClaimShape { per_url: Some(2), skip_urls: Vec::new() }).await;
    assert_eq!(urls(&got).iter().filter(|u| **u == slow).count(), 2, "{got:?}");
    assert_eq!(urls(&got).iter().filter(|u| **u == quick).count(), 2, "{got:?}");
    // A skipped URL is neither claimed nor due.
    let got = take(ClaimShape { per_url: Some(10), skip_urls: vec![slow.clone()] }).await;
    assert_eq!(urls(&got), vec![quick.clone(); 3]);
    assert_eq!(
        store.notify_next_due(std::slice::from_ref(&slow)).await.expect("next"),
        Some(lease),
        "quick's are all leased"
    );
    assert_eq!(store.notify_next_due(&[]).await.expect("next"), Some(now), "slow's three are due");
    // Given back unattempted: due again at once, the claim's attempt taken back.
    let ids: Vec<i64> = got.iter().map(|e| e.id).collect();
    store.notify_release(&ids, now).await.expect("release");
    let again = take(ClaimShape { per_url: Some(10), skip_urls: vec![slow.clone()] }).await;
    assert_eq!(
        again.iter().map(|e| (e.id, e.attempts)).collect::<Vec<_>>(),
        ids.iter().map(|i| (*i, 1)).collect::<Vec<_>>()
    );
    // Deferred (its circuit opened): slow's pending rows wait until then, unattempted.
    let until = now + 30_000_000;
    assert_eq!(store.notify_defer(std::slice::from_ref(&slow), until).await.expect("defer"), 3);
    assert_eq!(store.notify_defer(std::slice::from_ref(&slow), now).await.expect("never earlier"), 0);
    assert_eq!(store.notify_next_due(&[]).await.expect("next"), Some(until));
    assert!(take(ClaimShape::default()).await.is_empty());
    h.clock.advance_secs(30);
    let late = take(ClaimShape::default()).await;
    assert_eq!(urls(&late), vec![slow.clone(); 3]);
    assert!(late.iter().all(|e| e.attempts == 1), "{late:?}");
}

async fn multi_consumer_notifications_follow_deliveries(b: Backend) {
    let h = Harness::new(b).await;
    let mut s = h.session("scott");
    h.run(&mut s, &register(TOPIC, "APP1", "http://93.184.216.34/app1")).await.expect("register APP1");
    h.run(&mut s, &register(TOPIC, "OTHER", "http://93.184.216.34/other")).await.expect("register OTHER");
    h.run(&mut s, &publish_emp(10, "", COMMIT)).await.expect("to the subscribers (APP1)");
    let got = claim(&h).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].consumer, "APP1");
    let r = h
        .run(
            &mut s,
            &publish_emp(
                20,
                "<recipient_list><recipient><agent_name>OTHER</agent_name></recipient></recipient_list>",
                COMMIT,
            ),
        )
        .await
        .expect("to OTHER only");
    assert_eq!(sent_ids(&r).len(), 1);
    let got = claim(&h).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].consumer, "OTHER");
}

async fn long_poll_wakes_on_commit(b: Backend) {
    let h = std::sync::Arc::new(Harness::new(b).await);
    let h2 = h.clone();
    let started = Instant::now();
    let waiter = tokio::spawn(async move {
        let mut c = h2.session("scott");
        h2.run(&mut c, &receive(RAWQ, "<wait_time>20</wait_time>", COMMIT)).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "77")], "")).await.expect("send");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "uncommitted work must not wake the receiver");
    h.run(&mut p, &envelope(COMMIT)).await.expect("commit");
    let r =
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken well before wait_time").expect("task");
    assert_eq!(raw_of(&received(&r.expect("message"))[0]), "77");
    assert!(started.elapsed() < Duration::from_secs(5));
}

async fn too_many_failed_dequeues_move_to_exception_queue(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01")], COMMIT)).await.expect("send");
    let mut c = h.session("scott");
    // max_retries is 5: the sixth rollback moves the message.
    for i in 0..6 {
        assert_eq!(recv_raw(&h, &mut c, "", "").await, Ok("01".into()), "attempt {i}");
        h.run(&mut c, &envelope(ROLLBACK)).await.expect("rollback");
    }
    assert_eq!(recv_raw(&h, &mut c, "", "").await, Err(code::NO_MESSAGE));
    assert_eq!(depth(&h, "AQUSER.AQ$_RAW_TAB_E").await, 1);
}

/// Too many failed dequeues on a multi-consumer queue (as Oracle does it): the consumer
/// that failed no longer sees the message, the others still do, and once nobody can take
/// it any more it moves to the exception queue.
async fn a_multi_consumer_message_moves_once_no_consumer_can_take_it(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    let both = "<recipient_list><recipient><agent_name>APP1</agent_name></recipient>\
                <recipient><agent_name>APP2</agent_name></recipient></recipient_list>";
    h.run(&mut p, &publish_emp(30, both, COMMIT)).await.expect("publish");
    let eq = "AQUSER.AQ$_EMP_TOPIC_TAB_E";
    let fail = |consumer: &'static str| {
        let h = &h;
        async move {
            let mut c = h.session("scott");
            // max_retries is 5: the sixth rollback is one too many.
            for i in 0..6 {
                let r = h
                    .run(
                        &mut c,
                        &receive(
                            TOPIC,
                            &format!("<consumer_name>{consumer}</consumer_name><wait_time>0</wait_time>"),
                            "",
                        ),
                    )
                    .await;
                assert_eq!(deptno_of(&r.expect("delivered again")), "30", "{consumer}, attempt {i}");
                h.run(&mut c, &envelope(ROLLBACK)).await.expect("rollback");
            }
        }
    };
    fail("APP1").await;
    let mut c = h.session("scott");
    assert_eq!(fault_code(h.run(&mut c, &emp_receive("APP1", "")).await), code::NO_MESSAGE, "APP1 gave up");
    assert_eq!(depth(&h, eq).await, 0, "APP2 can still take it");
    fail("APP2").await;
    assert_eq!(fault_code(h.run(&mut c, &emp_receive("APP2", "")).await), code::NO_MESSAGE);
    assert_eq!(depth(&h, eq).await, 1, "nobody can take it now");
    let r = h.run(&mut c, &receive(eq, "<wait_time>0</wait_time>", COMMIT)).await.expect("from the exception queue");
    assert_eq!(received(&r)[0].header.message_state, Some(3));
    assert_eq!(deptno_of(&r), "30");
    assert_eq!(depth(&h, TOPIC).await, 0);
}

/// The default topology with `max_retries = 1` on AQUSER.EMP_TOPIC: a consumer's second
/// rollback of a message is one too many.
fn one_retry_topology() -> String {
    let q = "name = \"AQUSER.EMP_TOPIC\"\nqueue_table = \"AQUSER.EMP_TOPIC_TAB\"\n";
    assert!(aqgate_admin::DEFAULT_TOPOLOGY.contains(q));
    aqgate_admin::DEFAULT_TOPOLOGY.replacen(q, &format!("{q}max_retries = 1\n"), 1)
}

const EMP_EQ: &str = "AQUSER.AQ$_EMP_TOPIC_TAB_E";

/// A publish to `consumers` of a message with correlation `corr`.
fn publish_to(corr: &str, consumers: &[&str]) -> String {
    let list: String =
        consumers.iter().map(|c| format!("<recipient><agent_name>{c}</agent_name></recipient>")).collect();
    publish_emp(30, &format!("<correlation>{corr}</correlation><recipient_list>{list}</recipient_list>"), COMMIT)
}

/// A REMOVE of `consumer`'s message with correlation `corr` (`extra`: e.g. a commit).
fn take_corr(consumer: &str, corr: &str, extra: &str) -> String {
    receive(
        TOPIC,
        &format!(
            "<consumer_name>{consumer}</consumer_name><wait_time>0</wait_time>\
             <selector><correlation>{corr}</correlation></selector>"
        ),
        extra,
    )
}

/// The `AQ$EMP_TOPIC_TAB` rows of the message with correlation `corr` in `queue`, as
/// (consumer, state).
async fn view_of(h: &Harness, queue: &str, corr: &str) -> Vec<(String, String)> {
    let rows = h.engine.store().view_rows("AQUSER.EMP_TOPIC_TAB", queue, None, 10_000).await.expect("view");
    let at = |c: &str| aqgate_store::views::listed_columns().position(|x| x == c).expect("column");
    let mut out: Vec<(String, String)> = rows
        .into_iter()
        .filter(|r| r[at("corr_id")].as_deref() == Some(corr))
        .map(|r| (r[at("consumer_name")].clone().unwrap_or_default(), r[at("msg_state")].clone().unwrap_or_default()))
        .collect();
    out.sort();
    out
}

fn rows(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs.iter().map(|(c, s)| (c.to_string(), s.to_string())).collect();
    v.sort();
    v
}

/// max_retries = 1 and consumers APP1 and APP2: APP1 rolls back twice and gives up on the
/// message, which it never processed; so the message ends in the exception queue once APP2
/// is done with it, whether APP2 took it before or after (by a commit of its own or in the
/// request of its receive), and not before.
async fn a_consumer_that_gave_up_sends_the_message_to_the_exception_queue_in_either_order(b: Backend) {
    let h = Harness::with_topology(b, &one_retry_topology()).await;
    let mut p = h.session("scott");
    let fail_twice = |corr: &'static str| {
        let h = &h;
        async move {
            let mut c = h.session("scott");
            for i in 0..2 {
                let r = h.run(&mut c, &take_corr("APP1", corr, "")).await;
                assert_eq!(deptno_of(&r.expect("delivered again")), "30", "{corr}: attempt {i}");
                h.run(&mut c, &envelope(ROLLBACK)).await.expect("rollback");
            }
            let r = h.run(&mut c, &take_corr("APP1", corr, COMMIT)).await;
            assert_eq!(fault_code(r), code::NO_MESSAGE, "{corr}: APP1 gave up on it");
        }
    };
    // APP1 gives up first; APP2 then takes it and commits: it moves at that commit.
    for (corr, one_request) in [("first-then-commit", false), ("first-then-take-and-commit", true)] {
        h.run(&mut p, &publish_to(corr, &["APP1", "APP2"])).await.expect("publish");
        fail_twice(corr).await;
        assert_eq!(
            view_of(&h, TOPIC, corr).await,
            rows(&[("APP1", "UNDELIVERABLE"), ("APP2", "READY")]),
            "{corr}: APP2 can still take it"
        );
        assert!(view_of(&h, EMP_EQ, corr).await.is_empty(), "{corr}");
        let mut c = h.session("scott");
        if one_request {
            let r = h.run(&mut c, &take_corr("APP2", corr, COMMIT)).await.expect("APP2 takes it");
            assert_eq!(deptno_of(&r), "30");
        } else {
            let r = h.run(&mut c, &take_corr("APP2", corr, "")).await.expect("APP2 takes it");
            assert_eq!(deptno_of(&r), "30");
            assert!(view_of(&h, EMP_EQ, corr).await.is_empty(), "{corr}: not before APP2's commit");
            h.run(&mut c, &envelope(COMMIT)).await.expect("commit");
        }
        assert!(view_of(&h, TOPIC, corr).await.is_empty(), "{corr}");
        assert_eq!(
            view_of(&h, EMP_EQ, corr).await,
            rows(&[("", "EXPIRED"), ("APP2", "PROCESSED")]),
            "{corr}: in the exception queue, with APP2's dequeue"
        );
    }
    // APP2 takes it first; APP1 then gives up: it moves at APP1's last rollback.
    let corr = "second";
    h.run(&mut p, &publish_to(corr, &["APP1", "APP2"])).await.expect("publish");
    let mut c = h.session("scott");
    h.run(&mut c, &take_corr("APP2", corr, COMMIT)).await.expect("APP2 takes it");
    assert_eq!(view_of(&h, TOPIC, corr).await, rows(&[("APP1", "READY"), ("APP2", "PROCESSED")]));
    fail_twice(corr).await;
    assert!(view_of(&h, TOPIC, corr).await.is_empty());
    assert_eq!(view_of(&h, EMP_EQ, corr).await, rows(&[("", "EXPIRED"), ("APP2", "PROCESSED")]));
    // Three exception-queue messages, each once, in state 3.
    let mut got = Vec::new();
    loop {
        match h.run(&mut c, &receive(EMP_EQ, "<wait_time>0</wait_time>", COMMIT)).await {
            Ok(r) => {
                let m = &received(&r)[0];
                assert_eq!(m.header.message_state, Some(3));
                got.push(m.header.correlation.clone().unwrap_or_default());
            }
            Err((c, _)) => {
                assert_eq!(c, code::NO_MESSAGE);
                break;
            }
        }
    }
    got.sort();
    assert_eq!(got, ["first-then-commit", "first-then-take-and-commit", "second"]);
    assert_eq!(depth(&h, TOPIC).await, 0);
}

/// Where a consumer of one message stands, in the model of
/// `max_retries_on_a_multi_consumer_queue_in_any_order`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stand {
    /// Has not taken it (yet), after `retries` failed attempts.
    Open { retries: u32 },
    /// Holds it (an uncommitted REMOVE).
    Holding { retries: u32 },
    /// Took it and committed.
    Done,
    /// Rolled it back more than max_retries (1) times.
    GaveUp,
}

/// What a consumer does next.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    /// A REMOVE left uncommitted.
    Take,
    Rollback,
    Commit,
    /// A REMOVE that commits in its own request.
    TakeAndCommit,
    /// A REMOVE that must find nothing (the consumer is done with the message, or gave up).
    Probe,
}

/// A consumer's script: `failures` taken-and-rolled-back attempts (two: it gives up), then,
/// unless it gave up, the message taken and committed (in one request, or two).
fn script(failures: u32, one_request: bool) -> Vec<Step> {
    let mut s: Vec<Step> = (0..failures).flat_map(|_| [Step::Take, Step::Rollback]).collect();
    if failures < 2 {
        s.extend(if one_request { &[Step::TakeAndCommit][..] } else { &[Step::Take, Step::Commit][..] });
    }
    s.push(Step::Probe);
    s
}

/// The rule for max_retries on a multi-consumer queue (docs/operations.md, "Administration"),
/// over random interleavings of the dequeues, rollbacks and commits of two or three
/// consumers (max_retries = 1): a
/// consumer past max_retries no longer sees the message; the message moves to the
/// exception queue once no consumer can take it any more if some consumer gave up on it,
/// is deleted once all of them took it otherwise, and stays until then. Checked after
/// every step through the `AQ$` view.
async fn max_retries_on_a_multi_consumer_queue_in_any_order(b: Backend) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use std::sync::atomic::{AtomicU32, Ordering};
    let h = Harness::with_topology(b, &one_retry_topology()).await;
    let handle = tokio::runtime::Handle::current();
    let (case, moved_at_commit) = (AtomicU32::new(0), AtomicU32::new(0));
    // Per consumer (failed attempts, taken in one request), and the interleaving: which of
    // the consumers with steps left goes next.
    let strategy = (2usize..=3).prop_flat_map(|k| {
        (proptest::collection::vec((0u32..=2, any::<bool>()), k), proptest::collection::vec(any::<u32>(), 24))
    });
    let mut runner = TestRunner::new(Config { cases: 48, failure_persistence: None, ..Config::default() });
    let outcome = runner.run(&strategy, |(consumers, picks)| {
        let corr = format!("case-{}", case.fetch_add(1, Ordering::Relaxed));
        let scripts: Vec<Vec<Step>> = consumers.iter().map(|&(f, one)| script(f, one)).collect();
        let at_commit = tokio::task::block_in_place(|| handle.block_on(retry_case(&h, &corr, scripts, &picks)));
        moved_at_commit.fetch_add(u32::from(at_commit), Ordering::Relaxed);
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
    assert!(moved_at_commit.load(Ordering::Relaxed) > 0, "no case had a consumer give up before another one's commit");
}

/// One case of `max_retries_on_a_multi_consumer_queue_in_any_order`: the consumers' scripts
/// interleaved as `picks` say. Returns whether the message moved at a commit (the remove
/// of the last consumer that could still take it, after another one gave up).
async fn retry_case(h: &Harness, corr: &str, scripts: Vec<Vec<Step>>, picks: &[u32]) -> bool {
    let names = ["APP1", "APP2", "APP3"];
    let names = &names[..scripts.len()];
    let mut p = h.session("scott");
    h.run(&mut p, &publish_to(corr, names)).await.expect("publish");
    let mut sessions: Vec<_> = names.iter().map(|_| h.session("scott")).collect();
    let mut stand = vec![Stand::Open { retries: 0 }; names.len()];
    let mut scripts: Vec<std::collections::VecDeque<Step>> = scripts.into_iter().map(Into::into).collect();
    let mut moved_at_commit = false;
    for i in 0.. {
        let ready: Vec<usize> = (0..scripts.len()).filter(|c| !scripts[*c].is_empty()).collect();
        if ready.is_empty() {
            break;
        }
        let c = ready[picks.get(i).map_or(0, |p| *p as usize % ready.len())];
        let step = scripts[c].pop_front().expect("a step");
        let (name, s) = (names[c], &mut sessions[c]);
        let ctx = format!("{corr}, step {i}: {name} {step:?}, before: {stand:?}");
        let got = |r: Result<Response, (i32, String)>| {
            assert_eq!(deptno_of(&r.unwrap_or_else(|e| panic!("{ctx}: {e:?}"))), "30", "{ctx}");
        };
        stand[c] = match (step, stand[c]) {
            (Step::Take, Stand::Open { retries }) => {
                got(h.run(s, &take_corr(name, corr, "")).await);
                Stand::Holding { retries }
            }
            (Step::TakeAndCommit, Stand::Open { .. }) => {
                got(h.run(s, &take_corr(name, corr, COMMIT)).await);
                Stand::Done
            }
            (Step::Rollback, Stand::Holding { retries }) => {
                h.run(s, &envelope(ROLLBACK)).await.expect("rollback");
                if retries + 1 > 1 { Stand::GaveUp } else { Stand::Open { retries: retries + 1 } }
            }
            (Step::Commit, Stand::Holding { .. }) => {
                h.run(s, &envelope(COMMIT)).await.expect("commit");
                Stand::Done
            }
            (Step::Probe, done @ (Stand::Done | Stand::GaveUp)) => {
                let r = h.run(s, &take_corr(name, corr, COMMIT)).await;
                assert_eq!(fault_code(r), code::NO_MESSAGE, "{ctx}: no longer seen");
                done
            }
            other => panic!("{ctx}: the script does not fit the model: {other:?}"),
        };
        // Where the message is now, by the rule.
        let left = stand.iter().any(|s| matches!(s, Stand::Open { .. } | Stand::Holding { .. }));
        let gave_up = stand.contains(&Stand::GaveUp);
        let in_topic = view_of(h, TOPIC, corr).await;
        let in_eq = view_of(h, EMP_EQ, corr).await;
        let state = |s: &Stand| match s {
            Stand::Done => "PROCESSED",
            Stand::GaveUp => "UNDELIVERABLE",
            _ => "READY",
        };
        if left {
            let want: Vec<(&str, &str)> = names.iter().zip(&stand).map(|(n, s)| (*n, state(s))).collect();
            assert_eq!(in_topic, rows(&want), "{ctx}: still in the queue");
            assert!(in_eq.is_empty(), "{ctx}: not in the exception queue yet: {in_eq:?}");
        } else if gave_up {
            assert!(in_topic.is_empty(), "{ctx}: moved: {in_topic:?}");
            let mut want: Vec<(&str, &str)> =
                names.iter().zip(&stand).filter(|(_, s)| **s == Stand::Done).map(|(n, _)| (*n, "PROCESSED")).collect();
            want.push(("", "EXPIRED"));
            assert_eq!(in_eq, rows(&want), "{ctx}: in the exception queue");
            moved_at_commit |= matches!(step, Step::Commit | Step::TakeAndCommit);
        } else {
            assert!(in_topic.is_empty() && in_eq.is_empty(), "{ctx}: deleted: {in_topic:?} {in_eq:?}");
        }
    }
    if stand.contains(&Stand::GaveUp) {
        // Taken from the exception queue, so that it stays small.
        let sel = format!("<wait_time>0</wait_time><selector><correlation>{corr}</correlation></selector>");
        let r = h.run(&mut p, &receive(EMP_EQ, &sel, COMMIT)).await.expect("from the exception queue");
        assert_eq!(received(&r)[0].header.message_state, Some(3), "{corr}");
    }
    moved_at_commit
}

async fn payload_conditions_on_adt_and_jms(b: Backend) {
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &publish_emp(10, "", COMMIT)).await.expect("10");
    h.run(&mut p, &publish_emp(40, "", COMMIT)).await.expect("40, no salary");
    let with_salary = example("02").replace("</message_set>", "</message_set><AQXmlCommit/>");
    h.run(&mut p, &with_salary).await.expect("example 02: 40, salary 4350");
    let mut c = h.session("scott");
    // Example 06 selects deptno = 40 with a salary above 3000 (a NULL salary is UNKNOWN).
    let r = h.run(&mut c, &example("06")).await.expect("example 06");
    assert_eq!(deptno_of(&r), "40");
    assert_eq!(received(&r)[0].payload.child("ENAME").map(|e| e.text()).as_deref(), Some("Okafor"));
    let mut j = h.session("john");
    h.run(&mut j, &example("03")).await.expect("example 03");
    h.run(&mut j, &envelope(COMMIT)).await.expect("commit");
    let q = "AQUSER.JMS_TEXTQ";
    let r = h
        .run(
            &mut j,
            &receive(q, "<wait_time>0</wait_time><selector><condition>Warehouse = 'PDX-1'</condition></selector>", ""),
        )
        .await;
    assert_eq!(fault_code(r), code::NO_MESSAGE);
    let r = h.run(&mut j, &receive(q, "<wait_time>0</wait_time><selector><condition>Warehouse = 'PDX-2' AND \"Carrier\" LIKE 'Cascade%'</condition></selector>", COMMIT)).await.expect("JMS property selector");
    let m = &received(&r)[0];
    assert_eq!(m.payload.child("text_data").map(|t| t.text()).as_deref(), Some("Pallet 17 leaves dock 3 at 06:40."));
}

async fn disabled_queues_refuse(b: Backend) {
    let topo = aqgate_admin::DEFAULT_TOPOLOGY.replace(
        "name = \"AQUSER.RAW_QUE\"\nqueue_table = \"AQUSER.RAW_TAB\"",
        "name = \"AQUSER.RAW_QUE\"\nqueue_table = \"AQUSER.RAW_TAB\"\nenqueue = false\ndequeue = false",
    );
    assert_ne!(topo, aqgate_admin::DEFAULT_TOPOLOGY);
    let h = Harness::with_topology(b, &topo).await;
    let mut s = h.session("scott");
    assert_eq!(fault_code(h.run(&mut s, &raw_send(RAWQ, &[("", "01")], COMMIT)).await), code::ENQUEUE_DISABLED);
    assert_eq!(recv_raw(&h, &mut s, "", "").await, Err(code::DEQUEUE_DISABLED));
    assert_eq!(
        fault_code(h.run(&mut s, &raw_send("AQUSER.AQ$_RAW_TAB_E", &[("", "01")], COMMIT)).await),
        code::ENQUEUE_DISABLED,
        "exception queues take no enqueues"
    );
}

async fn consumers_removing_at_once_leave_no_orphans(b: Backend) {
    let topo =
        format!("{}\n[[subscribers]]\nqueue = \"AQUSER.EMP_TOPIC\"\nname = \"APP2\"\n", aqgate_admin::DEFAULT_TOPOLOGY);
    let h = std::sync::Arc::new(Harness::with_topology(b, &topo).await);
    let mut p = h.session("scott");
    for i in 0..30 {
        h.run(&mut p, &publish_emp(i % 90, "", COMMIT)).await.expect("publish");
    }
    assert_eq!(depth(&h, TOPIC).await, 30);
    let mut tasks = Vec::new();
    for (consumer, immediate) in [("APP1", false), ("APP2", false), ("APP1", true), ("APP2", true)] {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = h.session("scott");
            let vis = if immediate { "<visibility>IMMEDIATE</visibility>" } else { "" };
            let mut n = 0;
            if immediate {
                while h.run(&mut s, &emp_receive(consumer, vis)).await.is_ok() {
                    n += 1;
                }
            } else {
                // A pending remove, committed by its own request.
                let opts = format!("<consumer_name>{consumer}</consumer_name><wait_time>0</wait_time>");
                while h.run(&mut s, &receive(TOPIC, &opts, "")).await.is_ok() {
                    h.run(&mut s, &envelope(COMMIT)).await.expect("commit");
                    n += 1;
                }
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    assert_eq!(total, 60, "every consumer got every message once");
    assert_eq!(depth(&h, TOPIC).await, 0, "the last consumer out deleted each message");
}

fn send_payload(dest: &str, payload: &str) -> String {
    envelope(&format!(
        r#"<AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{dest}</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_payload>{payload}</message_payload></message></message_set><AQXmlCommit/></AQXmlSend>"#
    ))
}

async fn xml_and_jms_map_payloads_round_trip(b: Backend) {
    let h = Harness::new(b).await;
    let mut s = h.session("scott");
    let doc = r#"<po:order xmlns:po="urn:example:po" id="7"><po:note>mixed <b>bold</b> &amp; text</po:note><po:qty>3</po:qty></po:order>"#;
    h.run(&mut s, &send_payload("AQUSER.XML_QUE", doc)).await.expect("XMLType send");
    let r =
        h.run(&mut s, &receive("AQUSER.XML_QUE", "<wait_time>0</wait_time>", COMMIT)).await.expect("XMLType receive");
    let m = &received(&r)[0];
    assert_eq!(m.payload.name, "po:order");
    assert!(m.payload.attrs.contains(&("id".to_string(), "7".to_string())));
    let mut out = String::new();
    aqgate_proto::idap::write_node(&mut out, &m.payload);
    assert!(out.contains("mixed <b>bold</b> &amp; text"), "{out}");

    let map = r#"<jms_map_message><user_properties><property><name>kind</name><string_value>order</string_value></property></user_properties><map_data><item><name>qty</name><int_value>3</int_value></item><item><name>sku</name><string_value>A-1</string_value></item></map_data></jms_map_message>"#;
    h.run(&mut s, &send_payload("AQUSER.JMS_MAPQ", map)).await.expect("JMS map send");
    let r = h
        .run(&mut s, &send_payload("AQUSER.JMS_MAPQ", "<jms_text_message><text_data>x</text_data></jms_text_message>"))
        .await;
    assert_eq!(fault_code(r), code::PAYLOAD_MISMATCH, "a text message on a map queue");
    let r = h
        .run(
            &mut s,
            &receive(
                "AQUSER.JMS_MAPQ",
                "<wait_time>0</wait_time><selector><condition>kind = 'order'</condition></selector>",
                COMMIT,
            ),
        )
        .await
        .expect("JMS map receive");
    let m = &received(&r)[0];
    let items: Vec<String> = m
        .payload
        .child("map_data")
        .expect("map_data")
        .elements()
        .map(|i| i.child("name").map(|n| n.text()).unwrap_or_default())
        .collect();
    assert_eq!(items, ["qty", "sku"]);
}

/// 10,000 sessions with open transactions hold no database connection between requests
/// (one agent's: its limit raised for them).
async fn many_open_sessions_share_few_connections(b: Backend) {
    let n = 10_000;
    let shares = aqgate_core::engine::Shares { max_sessions_per_agent: n, ..Default::default() };
    let config = aqgate_core::engine::EngineConfig { shares, ..Default::default() };
    let h = Harness::with_config(b, aqgate_admin::DEFAULT_TOPOLOGY, config).await;
    let mut sessions = Vec::with_capacity(n);
    let xml = raw_send(RAWQ, &[("", "01")], "");
    let req = aqgate_proto::idap::parse_request(xml.as_bytes(), &Default::default()).expect("parse").body;
    for _ in 0..n {
        let mut s = h.session("SCOTT");
        h.exec(&mut s, req.clone()).await.expect("open send");
        sessions.push(s);
    }
    assert_eq!(h.engine.store().session_count().await.expect("count"), i64::try_from(n).expect("n"));
    assert_eq!(depth(&h, RAWQ).await, 0, "nothing committed yet");
    if let Backend::Postgres = b {
        let db = h.url.rsplit('/').next().expect("db name").to_string();
        let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&pg_admin_url()).await.expect("connect");
        let used: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
            .bind(&db)
            .fetch_one(&mut c)
            .await
            .expect("pg_stat_activity");
        assert!(used <= 20, "{used} connections for {n} open sessions");
    }
    // Every other session commits; the rest roll back.
    for (i, s) in sessions.iter_mut().enumerate() {
        let x = if i % 2 == 0 { COMMIT } else { ROLLBACK };
        h.run(s, &envelope(x)).await.expect("end transaction");
    }
    assert_eq!(depth(&h, RAWQ).await, i64::try_from(n / 2).expect("fits"));
}

/// PostgreSQL: sends of an open transaction are written provisionally (without waiting
/// for their WAL flush), together with the session row, so a database crash can lose the
/// newest writes, the session's own count with them. The row remembers the server run of
/// its last write: if the server restarted since (simulated here by moving that time
/// back), the commit is refused with 25402, also after a durable write of the same
/// transaction in the new run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_restart_since_a_provisional_write_refuses_the_commit() {
    let b = Backend::Postgres;
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01")], COMMIT)).await.expect("committed");
    h.run(&mut p, &raw_send(RAWQ, &[("", "02")], "")).await.expect("open, provisional");
    sql_on(&h, b, "UPDATE sessions SET epoch = epoch - interval '1 hour'").await;
    let aqgate_core::engine::Resumed::Live(mut s) = h.engine.resume(&p.id).await.expect("resume") else {
        panic!("live")
    };
    assert!(!s.intact, "the server restarted since a provisional write");
    assert_eq!(recv_raw(&h, &mut s, "<dequeue_mode>LOCKED</dequeue_mode>", "").await, Ok("01".into()), "durable");
    let (c, _) = h.run(&mut s, &envelope(COMMIT)).await.expect_err("may have lost work");
    assert_eq!(c, code::TRANSACTION_LOST);
    h.run(&mut s, &envelope(ROLLBACK)).await.expect("rollback");
    h.run(&mut s, &raw_send(RAWQ, &[("", "03")], "")).await.expect("a new transaction");
    h.run(&mut s, &envelope(COMMIT)).await.expect("commits: its writes are of this run");
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("01".into()));
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("03".into()));
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Err(code::NO_MESSAGE), "02 was rolled back");
}

/// PostgreSQL: a crash lost the newest, provisional write of a transaction (a send after a
/// durable receive), so the row is back at the receive's version and counts no send. The
/// commit is refused with 25402 both by the process that wrote the send (its copy of the
/// row is newer than the row) and by any other (the row was last written in another
/// server run); a rollback then puts the received message back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_lost_provisional_send_is_never_committed() {
    let b = Backend::Postgres;
    let h = Harness::new(b).await;
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "CA")], COMMIT)).await.expect("committed");
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", "").await, Ok("CA".into()), "a durable remove, open");
    let (version, pending, enqueued) = (c.stored.expect("stored"), c.pending, c.enqueued);
    h.run(&mut c, &raw_send(RAWQ, &[("", "D0")], "")).await.expect("a provisional send");
    // The crash: the send's rows and its row write are gone; the server runs anew.
    sql_on(
        &h,
        b,
        &format!(
            "DELETE FROM messages WHERE enq_txn IS NOT NULL AND lock_txn IS NULL; \
             UPDATE sessions SET version = {version}, pending = {pending}, enqueued = {enqueued}, \
                    epoch = epoch - interval '1 hour'"
        ),
    )
    .await;
    let (code_copy, _) = h.run(&mut c, &envelope(COMMIT)).await.expect_err("the writer's copy is newer");
    assert_eq!(code_copy, code::TRANSACTION_LOST);
    let store = aqgate_store::open(&h.url).await.expect("another process");
    let clock = h.clock.clone() as std::sync::Arc<dyn aqgate_core::clock::Clock>;
    let e2 = aqgate_core::engine::Engine::attach(store, clock, Default::default()).await.expect("attach");
    let aqgate_core::engine::Resumed::Live(mut s2) = e2.resume(&c.id).await.expect("resume") else { panic!("live") };
    let req = |x: &str| aqgate_proto::idap::parse_request(x.as_bytes(), &Default::default()).expect("parse").body;
    let e = e2.execute(&mut s2, req(&envelope(COMMIT))).await.expect_err("another process");
    assert_eq!(e.code, code::TRANSACTION_LOST);
    e2.execute(&mut s2, req(&envelope(ROLLBACK))).await.expect("rollback");
    let mut r = h.session("scott");
    assert_eq!(recv_raw(&h, &mut r, "", COMMIT).await, Ok("CA".into()), "the received message is back");
    assert_eq!(recv_raw(&h, &mut r, "", COMMIT).await, Err(code::NO_MESSAGE));
}

/// A commit in one process wakes a long-poll in another (PostgreSQL LISTEN/NOTIFY).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commit_in_another_process_wakes_a_long_poll() {
    let a = std::sync::Arc::new(Harness::new(Backend::Postgres).await);
    // The listener's signals wake this process's waiters, as the binary's time manager
    // forwards them (`serve` itself: `two_nodes_on_one_postgres_serve_any_session`).
    let mut signals = a.engine.store().listen().await.expect("listen").expect("PostgreSQL listens");
    let engine = a.engine.clone();
    tokio::spawn(async move {
        while let Some(q) = signals.recv().await {
            engine.wake(q);
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = second_process(&a).await;
    let a2 = a.clone();
    let started = Instant::now();
    let waiter = tokio::spawn(async move {
        let mut c = a2.session("scott");
        a2.run(&mut c, &receive(RAWQ, "<wait_time>30</wait_time>", COMMIT)).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    send_from(&b, "5A").await;
    let r = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("woken by NOTIFY").expect("task");
    assert_eq!(raw_of(&received(&r.expect("message"))[0]), "5A");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// The advisory lock class of interests (`aqgate-store`'s `postgres/interest.rs`).
const INTEREST_CLASS: i64 = 0x6171_6761;

/// A second process's engine on the harness's database.
async fn second_process(h: &Harness) -> std::sync::Arc<aqgate_core::engine::Engine> {
    let store = aqgate_store::open(&h.url).await.expect("second process store");
    let clock = h.clock.clone() as std::sync::Arc<dyn aqgate_core::clock::Clock>;
    aqgate_core::engine::Engine::start(store, clock, Default::default()).await.expect("second engine")
}

async fn send_from(e: &aqgate_core::engine::Engine, hex: &str) {
    let mut p = aqgate_core::engine::Session::new("SCOTT", 0);
    let req = aqgate_proto::idap::parse_request(raw_send(RAWQ, &[("", hex)], COMMIT).as_bytes(), &Default::default())
        .expect("parse")
        .body;
    e.execute(&mut p, req).await.expect("send in the other process");
}

async fn queue_id(h: &Harness, name: &str) -> i64 {
    let ids = h.engine.store().queue_ids().await.expect("queue ids");
    ids.into_iter().find(|(n, _)| n == name).map(|(_, id)| id).expect("queue exists")
}

/// Process A (the harness, listening) and process B on one database, and RAWQ's id.
async fn two_processes() -> (Harness, std::sync::Arc<aqgate_core::engine::Engine>, i64, tokio::sync::mpsc::Receiver<i64>)
{
    let a = Harness::new(Backend::Postgres).await;
    let b = second_process(&a).await;
    let q = queue_id(&a, RAWQ).await;
    let rx = a.engine.store().listen().await.expect("listen").expect("PostgreSQL has a channel");
    (a, b, q, rx)
}

/// Granted interests in `q` on the harness's database.
async fn interests_held(h: &Harness, q: i64) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&h.url).await.expect("connect");
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ShareLock'
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
         AND classid = $1 AND objid = $2 AND objsubid = 2",
    )
    .bind(INTEREST_CLASS)
    .bind(q)
    .fetch_one(&mut c)
    .await
    .expect("pg_locks")
}

async fn signalled_within(rx: &mut tokio::sync::mpsc::Receiver<i64>, d: Duration) -> Option<i64> {
    tokio::time::timeout(d, rx.recv()).await.ok().flatten()
}

/// Commits signal (NOTIFY) only the queues some process holds interest in: with nobody
/// waiting, a send costs no notification; an interest makes the next one signal; given up,
/// it lapses after its linger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commits_signal_only_queues_somebody_holds_interest_in() {
    let (a, b, q, mut rx) = two_processes().await;
    send_from(&b, "01").await;
    assert_eq!(signalled_within(&mut rx, Duration::from_millis(500)).await, None, "nobody waits: no NOTIFY");
    assert_eq!(interests_held(&a, q).await, 0);

    let interest = a.engine.store().interest(q).await.expect("interest");
    assert!(interest.is_held());
    assert_eq!(interests_held(&a, q).await, 1);
    send_from(&b, "02").await;
    assert_eq!(signalled_within(&mut rx, Duration::from_secs(10)).await, Some(q), "an interest is signalled");

    // A second holder shares the lock; the last one to go gives it up after the linger.
    let again = a.engine.store().interest(q).await.expect("second interest");
    assert_eq!(interests_held(&a, q).await, 1, "one lock per process and queue");
    drop(interest);
    drop(again);
    let deadline = Instant::now() + Duration::from_secs(20);
    while interests_held(&a, q).await > 0 {
        assert!(Instant::now() < deadline, "the interest was never given up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    send_from(&b, "03").await;
    assert_eq!(signalled_within(&mut rx, Duration::from_millis(500)).await, None, "given up: no NOTIFY again");
}

/// The handshake that leaves no gap: a commit that found nobody interested (and so sends
/// no NOTIFY) keeps the key until it has ended, so an interest asked for meanwhile is
/// granted only after that commit, and the waiter's next read sees its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_interest_is_granted_after_a_commit_that_did_not_signal() {
    use sqlx::Connection;
    let a = Harness::new(Backend::Postgres).await;
    let q = queue_id(&a, RAWQ).await;
    let mut committer = sqlx::PgConnection::connect(&a.url).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut committer).await.expect("begin");
    let nobody: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1::int4, $2::int4)")
        .bind(INTEREST_CLASS)
        .bind(q)
        .fetch_one(&mut committer)
        .await
        .expect("try lock");
    assert!(nobody, "nobody holds interest yet");
    let store = a.engine.store().clone();
    let mut waiter = tokio::spawn(async move { store.interest(q).await });
    assert!(
        tokio::time::timeout(Duration::from_millis(400), &mut waiter).await.is_err(),
        "interest granted while an unsignalled commit was still open"
    );
    sqlx::query("COMMIT").execute(&mut committer).await.expect("commit");
    let interest = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("granted after the commit")
        .expect("task")
        .expect("interest");
    assert!(interest.is_held());
    assert_eq!(interests_held(&a, q).await, 1);
}

/// A lost interest connection loses its locks: they are taken again, and this process's
/// waiters on those queues are woken to look again; later commits signal as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_lost_interest_connection_is_taken_again() {
    use sqlx::Connection;
    let (a, b, q, mut rx) = two_processes().await;
    let _interest = a.engine.store().interest(q).await.expect("interest");
    let mut admin = sqlx::PgConnection::connect(&a.url).await.expect("connect");
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'aqgate interest') t",
    )
    .fetch_one(&mut admin)
    .await
    .expect("terminate");
    assert_eq!(killed, 1, "only the process that took an interest has connected for it");
    assert_eq!(signalled_within(&mut rx, Duration::from_secs(15)).await, Some(q), "waiters woken to look again");
    assert_eq!(interests_held(&a, q).await, 1, "the interest is held again");
    send_from(&b, "04").await;
    assert_eq!(signalled_within(&mut rx, Duration::from_secs(10)).await, Some(q), "commits signal it again");
}

/// A session's commit, as a request of its own, signals like an inline one: only queues
/// somebody holds interest in, once per queue however many messages it publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_session_commit_signals_only_queues_somebody_holds_interest_in() {
    let (a, b, q, mut rx) = two_processes().await;
    let send_then_commit = |hexes: &'static [&'static str]| {
        let b = b.clone();
        async move {
            let mut p = aqgate_core::engine::Session::new("SCOTT", 0);
            let msgs: Vec<(&str, &str)> = hexes.iter().map(|h| ("", *h)).collect();
            for xml in [raw_send(RAWQ, &msgs, ""), envelope(COMMIT)] {
                let req = aqgate_proto::idap::parse_request(xml.as_bytes(), &Default::default()).expect("parse").body;
                b.execute(&mut p, req).await.expect("in the other process");
            }
        }
    };
    send_then_commit(&["01"]).await;
    assert_eq!(signalled_within(&mut rx, Duration::from_millis(500)).await, None, "nobody waits: no NOTIFY");
    let _interest = a.engine.store().interest(q).await.expect("interest");
    send_then_commit(&["02", "03"]).await;
    assert_eq!(signalled_within(&mut rx, Duration::from_secs(10)).await, Some(q), "an interest is signalled");
    assert_eq!(signalled_within(&mut rx, Duration::from_millis(500)).await, None, "once per queue");
    assert_eq!(depth(&a, RAWQ).await, 3, "all of them published");
}

/// A lost LISTEN connection loses the NOTIFYs sent until it listens again: once it does,
/// every waiter of the process (each holds interest in its queue) is woken to look again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_lost_listen_connection_wakes_the_waiters() {
    use sqlx::Connection;
    let (a, b, q, mut rx) = two_processes().await;
    let _interest = a.engine.store().interest(q).await.expect("interest");
    let mut admin = sqlx::PgConnection::connect(&a.url).await.expect("connect");
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()) t",
    )
    .fetch_one(&mut admin)
    .await
    .expect("terminate");
    assert!(killed >= 1, "the listener's connection was there to lose");
    assert_eq!(signalled_within(&mut rx, Duration::from_secs(15)).await, Some(q), "waiters woken to look again");
    // Listening again: another process's commit reaches it.
    send_from(&b, "04").await;
    assert_eq!(signalled_within(&mut rx, Duration::from_secs(10)).await, Some(q), "commits signal it again");
}

/// As after a database restart: every connection of the database is gone and new ones are
/// refused for a while. Once they are accepted again the process listens again, its
/// waiters are woken to look again, and other processes' commits reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_listening_resumes_after_the_database_refused_connections() {
    use sqlx::Connection;
    let (a, b, q, mut rx) = two_processes().await;
    let _interest = a.engine.store().interest(q).await.expect("interest");
    // From another database: a database cannot refuse connections to itself.
    let (server, db) = a.url.rsplit_once('/').expect("a database URL");
    let mut admin = sqlx::PgConnection::connect(&format!("{server}/postgres")).await.expect("connect");
    let allow = |yes: bool| format!("ALTER DATABASE \"{db}\" WITH ALLOW_CONNECTIONS {yes}");
    sqlx::query(&allow(false)).execute(&mut admin).await.expect("refuse connections");
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(db)
        .execute(&mut admin)
        .await
        .expect("terminate");
    tokio::time::sleep(Duration::from_secs(2)).await;
    while rx.try_recv().is_ok() {}
    sqlx::query(&allow(true)).execute(&mut admin).await.expect("accept connections");
    assert_eq!(signalled_within(&mut rx, Duration::from_secs(40)).await, Some(q), "waiters woken to look again");
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        send_from(&b, "05").await;
        if signalled_within(&mut rx, Duration::from_secs(2)).await == Some(q) {
            break;
        }
        assert!(Instant::now() < deadline, "commits never reached the listener again");
    }
}

/// A process whose dispatcher refreshes its registrations holds interest in the
/// registered queues, so that other processes' commits wake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_registered_queues_hold_interest_for_the_dispatcher() {
    let h = Harness::new(Backend::Postgres).await;
    let q = queue_id(&h, RAWQ).await;
    h.engine.refresh_registered().await.expect("refresh");
    assert_eq!(interests_held(&h, q).await, 0, "no registration, no interest");
    let mut s = h.session("scott");
    h.run(&mut s, &register(RAWQ, "", "http://93.184.216.34/hook")).await.expect("register");
    h.engine.refresh_registered().await.expect("refresh");
    assert_eq!(interests_held(&h, q).await, 1);
    h.run(&mut s, &register(RAWQ, "", "")).await.expect("unregister");
    h.engine.refresh_registered().await.expect("refresh");
    let deadline = Instant::now() + Duration::from_secs(20);
    while interests_held(&h, q).await > 0 {
        assert!(Instant::now() < deadline, "the interest outlived the registration");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn directory_destinations_and_agent_aliases(b: Backend) {
    // Without a directory: a clear fault.
    let plain = Harness::new(b).await;
    let mut s = plain.session("scott");
    let (c, msg) = plain.run(&mut s, &example01_via_directory()).await.expect_err("no directory");
    assert_eq!(c, code::DIRECTORY);
    assert!(msg.contains("NEW_ORDERS"), "{msg}");

    let h = Harness::with_directory(b).await;
    let mut s = h.session("scott");
    let r = h.run(&mut s, &example01_via_directory()).await.expect("LDAP destination + agent_alias");
    assert!(matches!(&r, Response::Send(_, Some(x)) if x.destination == "QS.NEW_ORDERS_QUE"), "{r:?}");
    h.run(&mut s, &envelope(COMMIT)).await.expect("commit");
    let recv = example("05").replace(
        "<destination>QS.NEW_ORDERS_QUE</destination>",
        r#"<destination lookup_type="LDAP">new_orders</destination>"#,
    );
    let r = h.run(&mut s, &recv).await.expect("receive through the directory name (case-insensitive)");
    let sender = received(&r)[0].header.sender_id.clone().expect("sender");
    assert_eq!(sender.name.as_deref(), Some("scott"));
    assert_eq!(sender.address.as_deref(), Some("AQUSER.EMP_TOPIC"));
    assert_eq!(sender.protocol, Some(0));

    // Unknown names: faults that name what was not found.
    let (c, msg) = h
        .run(&mut s, &example01_via_directory().replace(">NEW_ORDERS<", ">NO_SUCH_Q<"))
        .await
        .expect_err("unknown queue");
    assert_eq!(c, code::NO_SUCH_QUEUE);
    assert!(msg.contains("NO_SUCH_Q"), "{msg}");
    let (c, msg) =
        h.run(&mut s, &example01_via_directory().replace("SCOTT_ALIAS", "NOBODY*")).await.expect_err("unknown alias");
    assert_eq!(c, code::DIRECTORY);
    assert!(msg.contains("NOBODY*"), "{msg}");

    // A recipient given by alias becomes that agent as consumer.
    let publish = publish_emp(
        42,
        "<recipient_list><recipient><agent_alias>SCOTT_ALIAS</agent_alias></recipient></recipient_list>",
        COMMIT,
    );
    h.run(&mut s, &publish).await.expect("publish to an aliased recipient");
    let r = h.run(&mut s, &emp_receive("SCOTT", "")).await.expect("the alias's agent receives it");
    assert_eq!(deptno_of(&r), "42");
}

async fn mail_spool_stores_dedupes_and_retries(b: Backend) {
    use aqgate_core::store::SpoolPut;
    let h = Harness::new(b).await;
    let store = h.engine.store().clone();
    let mail = spooled("<m1@example.com>", "<Envelope/>");
    let SpoolPut::New(id) = store.spool_put(&mail).await.expect("put") else { panic!("first copy is new") };
    assert_eq!(store.spool_put(&mail).await.expect("put again"), SpoolPut::Duplicate(id));
    let other = spooled("<m2@example.com>", "<Envelope/>");
    let SpoolPut::New(other_id) = store.spool_put(&other).await.expect("put") else { panic!("another mail is new") };
    assert_ne!(other_id, id);
    let due = store.spool_due(T0, 10).await.expect("due");
    assert_eq!(due.len(), 2);
    assert_eq!(due[0].replies_wanted, 2, "one reply per copy received");
    // A failed attempt waits for its retry time.
    store.spool_attempted(id, None, Some("servlet down"), Some(T0 + 5_000_000)).await.expect("retry");
    assert_eq!(store.spool_due(T0 + 1, 10).await.expect("due").len(), 1);
    let again = store.spool_due(T0 + 5_000_000, 10).await.expect("due");
    assert_eq!(
        again.iter().find(|m| m.id == id).map(|m| (m.attempts, m.last_error.clone())),
        Some((1, Some("servlet down".into())))
    );
    // Forwarded: the response is kept; due again only while replies are owed.
    store.spool_attempted(id, Some(b"<resp/>"), None, None).await.expect("done");
    let m = store.spool_get(id).await.expect("get").expect("row");
    assert_eq!((m.state.as_str(), m.response.as_deref()), ("done", Some(&b"<resp/>"[..])));
    assert_eq!(store.spool_pending(10).await.expect("pending").len(), 2, "replies still owed");
    store.spool_replied(&[(id, 2), (other_id, 0)]).await.expect("replied");
    assert_eq!(store.spool_get(other_id).await.expect("get").map(|m| m.replies_sent), Some(0));
    assert!(store.spool_pending(10).await.expect("pending").iter().all(|m| m.id != id), "finished mail is not pending");
    assert!(store.spool_due(T0 + 10_000_000, 10).await.expect("due").iter().all(|m| m.id != id));
    // The dedupe window: within it a re-sent copy is recognised; a purge forgets only
    // finished mails received before the cut-off (never one still to forward or answer).
    assert_eq!(store.spool_purge(T0).await.expect("purge"), 0, "nothing received before T0");
    assert_eq!(store.spool_put(&mail).await.expect("re-sent"), SpoolPut::Duplicate(id));
    store.spool_replied(&[(id, 3)]).await.expect("replied");
    assert_eq!(store.spool_purge(T0 + 1).await.expect("purge"), 1, "only the finished mail goes");
    assert!(store.spool_get(id).await.expect("get").is_none());
    assert!(store.spool_get(other_id).await.expect("get").is_some(), "a mail still to forward is kept");
    assert!(matches!(store.spool_put(&mail).await.expect("after the window"), SpoolPut::New(n) if n != id));
}

/// A mail whose SMTP answer is not known yet (recipients still to hand on) is stored held:
/// not forwarded, no reply owed. A 4xx leaves it held, the client's next copy is the same
/// mail (not a re-send), and only its release makes it due, with one reply owed.
async fn held_mail_is_performed_and_answered_only_once_accepted(b: Backend) {
    use aqgate_core::store::SpoolPut;
    let h = Harness::new(b).await;
    let store = h.engine.store().clone();
    let mut mail = spooled("<h1@example.com>", "<Envelope/>");
    mail.state = "held".into();
    let SpoolPut::New(id) = store.spool_put(&mail).await.expect("put held") else { panic!("new") };
    let state = async |id| {
        let m = store.spool_get(id).await.expect("get").expect("row");
        (m.state, m.replies_wanted)
    };
    assert_eq!(state(id).await, ("held".into(), 0));
    assert!(store.spool_due(T0 + 1, 10).await.expect("due").is_empty(), "a held mail is not forwarded");
    // The reinjection failed (4xx); the client sends the mail again, held again.
    assert_eq!(store.spool_put(&mail).await.expect("again"), SpoolPut::New(id), "the same mail, not a re-send");
    assert_eq!(state(id).await, ("held".into(), 0));
    store.spool_release(id, T0).await.expect("accepted");
    assert_eq!(state(id).await, ("new".into(), 1), "one reply owed");
    assert_eq!(store.spool_due(T0, 10).await.expect("due").iter().map(|m| m.id).collect::<Vec<_>>(), vec![id]);
    store.spool_attempted(id, Some(b"<resp/>"), None, None).await.expect("done");
    // A real re-send later (held while its own recipients are handed on): one more reply,
    // but only once that copy is accepted.
    assert_eq!(store.spool_put(&mail).await.expect("re-sent"), SpoolPut::Duplicate(id));
    assert_eq!(state(id).await, ("done".into(), 1));
    store.spool_release(id, T0).await.expect("accepted");
    assert_eq!(state(id).await, ("done".into(), 2));
    // A held mail whose copy then comes for the gateway only (not held) is accepted by it.
    let mut other = spooled("<h2@example.com>", "<Envelope/>");
    other.state = "held".into();
    let SpoolPut::New(other_id) = store.spool_put(&other).await.expect("put held") else { panic!("new") };
    other.state = String::new();
    assert_eq!(store.spool_put(&other).await.expect("plain copy"), SpoolPut::New(other_id));
    assert_eq!(state(other_id).await, ("new".into(), 1));
    // A held mail nobody sends again is forgotten with the dedupe window.
    let mut lost = spooled("<h3@example.com>", "<Envelope/>");
    lost.state = "held".into();
    let SpoolPut::New(lost_id) = store.spool_put(&lost).await.expect("put held") else { panic!("new") };
    store.spool_purge(T0 + 1).await.expect("purge");
    assert!(store.spool_get(lost_id).await.expect("get").is_none());
    assert!(store.spool_get(other_id).await.expect("get").is_some(), "a mail still to forward is kept");
}

/// A re-sent copy (another Message-ID) records that Message-ID for the replies after the
/// first; a copy that came encrypted records the certificate replies are encrypted to, and
/// a later plain copy does not take it away. A copy of a still held mail is that mail.
async fn re_sent_mail_is_answered_in_its_thread_and_encryption_is_kept(b: Backend) {
    use aqgate_core::store::SpoolPut;
    let h = Harness::new(b).await;
    let store = h.engine.store().clone();
    let mail = spooled("m1@example.com", "<Envelope/>");
    let SpoolPut::New(id) = store.spool_put(&mail).await.expect("put") else { panic!("new") };
    let row = async |id| store.spool_get(id).await.expect("get").expect("row");
    assert_eq!((row(id).await.resend_message_id, row(id).await.encrypt_to), (None, None));
    let copy = aqgate_core::store::SpooledMail {
        message_id: "copy-1@example.com".into(),
        encrypt_to: Some(b"agent certificate".to_vec()),
        ..mail.clone()
    };
    assert_eq!(store.spool_put(&copy).await.expect("copy"), SpoolPut::Duplicate(id));
    let m = row(id).await;
    assert_eq!(m.message_id, "m1@example.com", "the first reply still answers the first mail");
    assert_eq!(m.resend_message_id.as_deref(), Some("copy-1@example.com"));
    assert_eq!(m.encrypt_to.as_deref(), Some(&b"agent certificate"[..]));
    let plain = aqgate_core::store::SpooledMail { message_id: "copy-2@example.com".into(), ..mail.clone() };
    assert_eq!(store.spool_put(&plain).await.expect("copy"), SpoolPut::Duplicate(id));
    let m = row(id).await;
    assert_eq!(m.resend_message_id.as_deref(), Some("copy-2@example.com"));
    assert_eq!(m.encrypt_to.as_deref(), Some(&b"agent certificate"[..]), "replies stay encrypted");
    assert_eq!(m.replies_wanted, 3);
    // Stored encrypted from the start.
    let enc = aqgate_core::store::SpooledMail {
        dedupe_key: "other".into(),
        encrypt_to: Some(b"cert".to_vec()),
        ..spooled("e1@example.com", "<Envelope/>")
    };
    let SpoolPut::New(enc_id) = store.spool_put(&enc).await.expect("put") else { panic!("new") };
    assert_eq!(row(enc_id).await.encrypt_to.as_deref(), Some(&b"cert"[..]));
    // Held, then its accepted copy: the same mail, not a re-send.
    let mut held = spooled("h1@example.com", "<Envelope/>");
    held.dedupe_key = "held".into();
    held.state = "held".into();
    let SpoolPut::New(held_id) = store.spool_put(&held).await.expect("held") else { panic!("new") };
    let accepted =
        aqgate_core::store::SpooledMail { message_id: "h1-again@example.com".into(), state: String::new(), ..held };
    assert_eq!(store.spool_put(&accepted).await.expect("accepted"), SpoolPut::New(held_id));
    assert_eq!(row(held_id).await.resend_message_id, None);
}

/// SMTP sessions spool mail while the servlet commits sends (on SQLite they share group
/// commits): every mail is stored once, re-sent copies are recognised as such even inside
/// the same batch, every send is committed, and every attempt recorded.
async fn concurrent_spooling_and_sending_all_commit(b: Backend) {
    use aqgate_core::store::SpoolPut;
    let h = std::sync::Arc::new(Harness::new(b).await);
    let store = h.engine.store().clone();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..24 {
        let store = store.clone();
        // Mails 0..8 arrive three times each, concurrently.
        let mail = spooled(&format!("<c{}@example.com>", i % 8), "<Envelope/>");
        tasks.spawn(async move { store.spool_put(&mail).await.expect("spool") });
    }
    let mut sessions = Vec::new();
    for t in 0..8 {
        let h = h.clone();
        sessions.push(tokio::spawn(async move {
            let mut s = h.session("scott");
            h.run(&mut s, &raw_send(RAWQ, &[("", &format!("{t:02X}"))], COMMIT)).await.expect("send")
        }));
    }
    let mut new = std::collections::HashMap::new();
    let mut duplicates = Vec::new();
    while let Some(put) = tasks.join_next().await {
        match put.expect("task") {
            SpoolPut::New(id) => assert!(new.insert(id, ()).is_none(), "id {id} handed out twice"),
            SpoolPut::Duplicate(id) => duplicates.push(id),
        }
    }
    for s in sessions {
        s.await.expect("send task");
    }
    assert_eq!(new.len(), 8, "one stored mail per distinct mail");
    assert_eq!(duplicates.len(), 16);
    assert!(duplicates.iter().all(|id| new.contains_key(id)), "duplicates point at stored mails");
    let stored = store.spool_pending(100).await.expect("pending");
    assert_eq!(stored.len(), 8);
    assert!(stored.iter().all(|m| m.replies_wanted == 3), "three copies of each want three replies");
    let mut done = tokio::task::JoinSet::new();
    for id in new.keys().copied() {
        let store = store.clone();
        done.spawn(async move { store.spool_attempted(id, Some(b"<r/>"), None, None).await.expect("attempted") });
    }
    while done.join_next().await.is_some() {}
    for id in new.keys() {
        let m = store.spool_get(*id).await.expect("get").expect("row");
        assert_eq!((m.state.as_str(), m.attempts), ("done", 1));
    }
    assert_eq!(depth(&h, RAWQ).await, 8, "every send committed");
}

/// Committed sends of many messages (on PostgreSQL written beside the group-commit writer,
/// concurrently): each is stored whole, in message order, and a set with one bad message
/// stores nothing.
async fn large_committed_sends_are_whole_and_in_order(b: Backend) {
    let h = std::sync::Arc::new(Harness::new(b).await);
    let mut tasks = Vec::new();
    for t in 0..3u8 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let hex: Vec<String> = (0..40u8).map(|i| format!("{t:02X}{i:02X}")).collect();
            let msgs: Vec<(&str, &str)> = hex.iter().map(|x| ("", x.as_str())).collect();
            let mut s = h.session("scott");
            sent_ids(&h.run(&mut s, &raw_send(RAWQ, &msgs, COMMIT)).await.expect("send 40")).len()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("task"), 40);
    }
    assert_eq!(depth(&h, RAWQ).await, 120);
    let mut bad: Vec<(&str, &str)> = vec![("", "AB"); 40];
    bad[34] = ("", "XYZ");
    let mut s = h.session("scott");
    assert!(h.run(&mut s, &raw_send(RAWQ, &bad, COMMIT)).await.is_err(), "invalid hex in message 35");
    assert_eq!(depth(&h, RAWQ).await, 120, "nothing of the bad set was stored");
    let mut s = h.session("scott");
    let mut got = Vec::new();
    while let Ok(x) = recv_raw(&h, &mut s, "", COMMIT).await {
        got.push(x);
    }
    assert_eq!(got.len(), 120);
    for t in 0..3u8 {
        let mine: Vec<&String> = got.iter().filter(|x| x.starts_with(&format!("{t:02X}"))).collect();
        let want: Vec<String> = (0..40u8).map(|i| format!("{t:02X}{i:02X}")).collect();
        assert_eq!(mine, want.iter().collect::<Vec<_>>(), "sender {t}'s messages in order");
    }
}

/// PostgreSQL only: the group-commit writers keep their own connections. When those are
/// lost (a server restart, a pooler's reset, here `pg_terminate_backend`), a committed
/// send still succeeds (its statement is sent again on a fresh connection, and a first
/// attempt that had committed is recognised by its message ids), receives recover, and
/// nothing is lost or stored twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_writers_survive_lost_connections() {
    use sqlx::Connection;
    let h = Harness::new(Backend::Postgres).await;
    let mut s = h.session("scott");
    h.run(&mut s, &raw_send(RAWQ, &[("", "A1")], COMMIT)).await.expect("first send");
    assert_eq!(recv_raw(&h, &mut s, "", COMMIT).await, Ok("A1".into()), "both writers have a connection now");
    h.run(&mut s, &raw_send(RAWQ, &[("", "A2")], COMMIT)).await.expect("second send");

    let mut admin = sqlx::PgConnection::connect(&h.url).await.expect("connect");
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()) t",
    )
    .fetch_one(&mut admin)
    .await
    .expect("terminate");
    assert!(killed >= 2, "the writers' connections were open ({killed} terminated)");
    // Wait until the server has closed them, so the next statement meets a dead socket.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut admin)
        .await
        .expect("count");
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "backends still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let r = h.run(&mut s, &raw_send(RAWQ, &[("", "A3"), ("", "A4")], COMMIT)).await;
    assert_eq!(sent_ids(&r.expect("a send after the connections were lost succeeds")).len(), 2);

    // A receive whose connection was lost fails before its statement runs (nothing taken);
    // the next attempt works. Drain the queue and check order and count.
    let mut got = Vec::new();
    let mut failures = 0;
    loop {
        match recv_raw(&h, &mut s, "", COMMIT).await {
            Ok(x) => got.push(x),
            Err(c) if c == code::NO_MESSAGE => break,
            Err(c) => {
                failures += 1;
                assert!(failures <= 3, "receives keep failing ({c})");
            }
        }
    }
    assert_eq!(got, vec!["A2", "A3", "A4"], "every committed message once, in order");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM messages").fetch_one(&mut admin).await.expect("count");
    assert_eq!(stored, 0, "nothing stored twice");
}

/// PostgreSQL only: deliveries have no foreign key to their messages (the per-row checks
/// cost a third of a batch enqueue), so every path that deletes messages must delete their
/// deliveries itself: rollback, restart recovery, receive, commit of a receive. And a
/// single-consumer message keeps its delivery state in its own row: it has no `deliveries`
/// row at any point, and its lock goes with the row or is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_deleting_messages_leaves_no_orphan_deliveries() {
    use sqlx::Connection;
    let h = Harness::new(Backend::Postgres).await;
    let mut admin = sqlx::PgConnection::connect(&h.url).await.expect("connect");
    // (deliveries, orphaned deliveries, single-consumer messages, locked ones)
    let rows = async |admin: &mut sqlx::PgConnection| -> (i64, i64, i64, i64) {
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM deliveries),
                    (SELECT count(*) FROM deliveries d WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.seq = d.msg_seq)),
                    (SELECT count(*) FROM messages WHERE single),
                    (SELECT count(*) FROM messages WHERE lock_txn IS NOT NULL)",
        )
        .fetch_one(admin)
        .await
        .expect("count rows")
    };
    // Multi-consumer: one delivery per recipient.
    let two = "<recipient_list><recipient><agent_name>APP1</agent_name></recipient><recipient><agent_name>APP2</agent_name></recipient></recipient_list>";
    let mut s = h.session("scott");
    h.run(&mut s, &publish_emp(10, two, "")).await.expect("open publish");
    assert_eq!(rows(&mut admin).await, (2, 0, 0, 0));
    h.run(&mut s, &envelope(ROLLBACK)).await.expect("rollback");
    assert_eq!(rows(&mut admin).await, (0, 0, 0, 0), "after rollback");
    h.run(&mut s, &publish_emp(20, two, "")).await.expect("open publish");
    orphan(&h, &s).await;
    h.engine.store().recover().await.expect("recover");
    assert_eq!(rows(&mut admin).await, (0, 0, 0, 0), "after recovery");
    let mut s = h.session("scott");
    h.run(&mut s, &publish_emp(30, two, COMMIT)).await.expect("publish");
    assert_eq!(deptno_of(&h.run(&mut s, &emp_receive("APP1", "")).await.expect("APP1")), "30");
    assert_eq!(rows(&mut admin).await, (1, 0, 0, 0), "APP2's delivery is left");
    assert_eq!(deptno_of(&h.run(&mut s, &emp_receive("APP2", "")).await.expect("APP2")), "30");
    assert_eq!(rows(&mut admin).await, (0, 0, 0, 0), "the last consumer took the message with it");

    // Single-consumer: the message row is the delivery.
    let mut s = h.session("scott");
    h.run(&mut s, &raw_send(RAWQ, &[("", "B1"), ("", "B2")], "")).await.expect("open send");
    assert_eq!(rows(&mut admin).await, (0, 0, 2, 0));
    h.run(&mut s, &envelope(ROLLBACK)).await.expect("rollback");
    assert_eq!(rows(&mut admin).await, (0, 0, 0, 0), "after rollback");
    h.run(&mut s, &raw_send(RAWQ, &[("", "C1"), ("", "C2"), ("", "C3")], COMMIT)).await.expect("send");
    assert_eq!(recv_raw(&h, &mut s, "", COMMIT).await, Ok("C1".into()), "the one-statement receive");
    assert_eq!(recv_raw(&h, &mut s, "", "").await, Ok("C2".into()), "a receive committed later");
    assert_eq!(rows(&mut admin).await, (0, 0, 2, 1), "C2 is locked for removal");
    h.run(&mut s, &envelope(COMMIT)).await.expect("commit");
    assert_eq!(rows(&mut admin).await, (0, 0, 1, 0), "after the commit only C3 is left");
    assert_eq!(recv_raw(&h, &mut s, "<dequeue_mode>LOCKED</dequeue_mode>", "").await, Ok("C3".into()));
    assert_eq!(rows(&mut admin).await, (0, 0, 1, 1), "C3 locked");
    orphan(&h, &s).await;
    h.engine.store().recover().await.expect("recover");
    assert_eq!(rows(&mut admin).await, (0, 0, 1, 0), "recovery releases an orphaned lock and keeps C3");
}

/// PostgreSQL only: a database written before single-consumer messages carried their own
/// delivery state (migrations up to 0005) keeps every message through the upgrade: the
/// single-consumer deliveries move into their messages (order, retry count and lock
/// included), the multi-consumer ones stay where they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_upgrade_moves_single_consumer_deliveries_into_messages() {
    use sqlx::Connection;
    let url = fresh_url(Backend::Postgres).await;
    let mut old = sqlx::migrate::Migrator::new(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/aqgate-store/migrations/postgres"
    )))
    .await
    .expect("migrations");
    old.migrations = std::borrow::Cow::Owned(old.migrations.iter().filter(|m| m.version <= 5).cloned().collect());
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    old.run(&mut conn).await.expect("the old schema");
    let raw: i64 = sqlx::query_scalar("INSERT INTO queues (name) VALUES ($1) RETURNING id")
        .bind(RAWQ)
        .fetch_one(&mut conn)
        .await
        .expect("queue");
    let topic: i64 = sqlx::query_scalar("INSERT INTO queues (name) VALUES ($1) RETURNING id")
        .bind(TOPIC)
        .fetch_one(&mut conn)
        .await
        .expect("topic");
    // Three single-consumer messages in the old layout (seq order O3, O1, O2 by prio_key;
    // O1 locked by a transaction the crash left open, retried twice) and one multi-consumer
    // message with deliveries for APP1 and APP2.
    for (seq, payload, prio_key, retry, lock) in
        [(1_i64, "O1", 0_i64, 2_i64, Some("dead-txn")), (2, "O2", 0, 0, None), (3, "O3", -1, 0, None)]
    {
        sqlx::query(
            "INSERT INTO messages (seq, msgid, queue_id, priority, enq_time, payload) VALUES ($1, $2, $3, 1, $4, $5)",
        )
        .bind(seq)
        .bind(vec![u8::try_from(seq).expect("small"); 16])
        .bind(raw)
        .bind(T0)
        .bind(payload.as_bytes().to_vec())
        .execute(&mut conn)
        .await
        .expect("message");
        sqlx::query(
            "INSERT INTO deliveries (msg_seq, queue_id, consumer, prio_key, retry_count, lock_txn, lock_kind) VALUES ($1, $2, '', $3, $4, $5, $6)",
        )
        .bind(seq)
        .bind(raw)
        .bind(prio_key)
        .bind(retry)
        .bind(lock)
        .bind(lock.map(|_| 2_i64))
        .execute(&mut conn)
        .await
        .expect("delivery");
    }
    sqlx::query(
        "INSERT INTO messages (seq, msgid, queue_id, priority, enq_time, payload) VALUES (4, $1, $2, 1, $3, '')",
    )
    .bind(vec![4_u8; 16])
    .bind(topic)
    .bind(T0)
    .execute(&mut conn)
    .await
    .expect("topic message");
    sqlx::query(
        "INSERT INTO deliveries (msg_seq, queue_id, consumer, prio_key) VALUES (4, $1, 'APP1', 0), (4, $1, 'APP2', 0)",
    )
    .bind(topic)
    .execute(&mut conn)
    .await
    .expect("topic deliveries");
    sqlx::query("SELECT setval('messages_seq_seq', 4)").execute(&mut conn).await.expect("sequence");

    let store = store_with_topology(&url, aqgate_admin::DEFAULT_TOPOLOGY).await;
    let moved: Vec<(i64, bool, i64, i64, Option<String>)> =
        sqlx::query_as("SELECT seq, single, prio_key, retry_count, lock_txn FROM messages ORDER BY seq")
            .fetch_all(&mut conn)
            .await
            .expect("messages");
    assert_eq!(
        moved,
        vec![
            (1, true, 0, 2, Some("dead-txn".into())),
            (2, true, 0, 0, None),
            (3, true, -1, 0, None),
            (4, false, 0, 0, None)
        ]
    );
    let left: Vec<String> = sqlx::query_scalar("SELECT consumer FROM deliveries ORDER BY consumer")
        .fetch_all(&mut conn)
        .await
        .expect("deliveries");
    assert_eq!(left, vec!["APP1", "APP2"]);

    // The engine's start releases the dead transaction's lock; the queue order holds.
    let clock = std::sync::Arc::new(aqgate_core::clock::ManualClock::new(T0 + 1_000_000));
    let engine =
        aqgate_core::engine::Engine::start(store, clock.clone() as std::sync::Arc<dyn Clock>, Default::default())
            .await
            .expect("engine");
    let h = Harness { engine, clock, url };
    let mut s = h.session("scott");
    let hex = |t: &str| t.bytes().map(|b| format!("{b:02X}")).collect::<String>();
    for want in ["O3", "O1", "O2"] {
        assert_eq!(recv_raw(&h, &mut s, "", COMMIT).await, Ok(hex(want)));
    }
    assert_eq!(recv_raw(&h, &mut s, "", COMMIT).await, Err(code::NO_MESSAGE));
}

const SEC: i64 = 1_000_000;

fn report(state: &str, propagated: i64, failed: i64, exceptions: i64) -> aqgate_core::store::JobReport {
    aqgate_core::store::JobReport { state: state.into(), propagated, failed, exceptions, ..Default::default() }
}

/// A job's lease goes to one owner at a time, is renewed by its owner only, and passes to
/// another once it has ended; reports add up whoever sends them, but only the holder sets
/// the state and the lease.
async fn propagation_job_leases_and_reports(b: Backend) {
    let h = Harness::new(b).await;
    let store = h.engine.store().clone();
    let t = h.clock.now();
    assert!(store.job_statuses().await.expect("statuses").is_empty());
    assert!(store.job_lease("ARCHIVE", "a:1:x", t, t + 15 * SEC).await.expect("lease"), "nobody held it");
    assert!(!store.job_lease("ARCHIVE", "b:2:y", t + SEC, t + 16 * SEC).await.expect("lease"), "a holds it");
    assert!(store.job_lease("ARCHIVE", "a:1:x", t + 5 * SEC, t + 20 * SEC).await.expect("renew"));
    let rows = store.job_statuses().await.expect("statuses");
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!((r.name.as_str(), r.owner.as_deref(), r.lease_until), ("ARCHIVE", Some("a:1:x"), Some(t + 20 * SEC)));
    assert_eq!((r.state.as_str(), r.propagated, r.failed, r.exceptions), ("RUNNING", 0, 0, 0));

    // The holder reports: state, counts, the last error and the last success.
    let mut rep = report("RETRYING", 30, 1, 2);
    rep.error = Some(("remote down".into(), t + 6 * SEC));
    rep.success_at = Some(t + 4 * SEC);
    let owner = store.job_report("ARCHIVE", "a:1:x", t + 6 * SEC, Some(t + 21 * SEC), &rep).await.expect("report");
    assert_eq!(owner.as_deref(), Some("a:1:x"));
    let owner = store
        .job_report("ARCHIVE", "a:1:x", t + 7 * SEC, Some(t + 22 * SEC), &report("RUNNING", 5, 0, 0))
        .await
        .expect("report");
    assert_eq!(owner.as_deref(), Some("a:1:x"));
    let r = store.job_statuses().await.expect("statuses").remove(0);
    assert_eq!((r.state.as_str(), r.propagated, r.failed, r.exceptions), ("RUNNING", 35, 1, 2));
    assert_eq!((r.last_error.as_deref(), r.last_error_at), (Some("remote down"), Some(t + 6 * SEC)), "kept");
    assert_eq!((r.last_success_at, r.lease_until, r.updated_at), (Some(t + 4 * SEC), Some(t + 22 * SEC), t + 7 * SEC));

    // Another process's report counts, but changes neither state nor lease.
    let owner = store
        .job_report("ARCHIVE", "b:2:y", t + 8 * SEC, Some(t + 99 * SEC), &report("FAILED", 1, 0, 0))
        .await
        .expect("report");
    assert_eq!(owner.as_deref(), Some("a:1:x"), "b does not hold the lease");
    let r = store.job_statuses().await.expect("statuses").remove(0);
    assert_eq!((r.state.as_str(), r.propagated, r.lease_until), ("RUNNING", 36, Some(t + 22 * SEC)));

    // The lease ends unrenewed (its holder died): b takes it, and a has lost it.
    assert!(!store.job_lease("ARCHIVE", "b:2:y", t + 21 * SEC, t + 36 * SEC).await.expect("lease"));
    assert!(store.job_lease("ARCHIVE", "b:2:y", t + 22 * SEC, t + 37 * SEC).await.expect("takeover"));
    let owner = store
        .job_report("ARCHIVE", "a:1:x", t + 23 * SEC, Some(t + 38 * SEC), &report("RUNNING", 0, 0, 0))
        .await
        .expect("report");
    assert_eq!(owner.as_deref(), Some("b:2:y"), "a learns it lost the lease");
    // b gives it up: nobody holds it, the row stays with its totals.
    let owner =
        store.job_report("ARCHIVE", "b:2:y", t + 24 * SEC, None, &report("RUNNING", 4, 0, 0)).await.expect("release");
    assert_eq!(owner, None);
    let r = store.job_statuses().await.expect("statuses").remove(0);
    assert_eq!((r.owner, r.lease_until, r.propagated), (None, None, 40));
    assert!(store.job_lease("ARCHIVE", "a:1:x", t + 25 * SEC, t + 40 * SEC).await.expect("free again"));

    // RESET_JOB: the failure count goes to 0 and the lease ends (the last error stays); the
    // holder learns it at its next report, and the job is free to take at once.
    assert!(store.job_reset("ARCHIVE").await.expect("reset"));
    let r = store.job_statuses().await.expect("statuses").remove(0);
    assert_eq!((r.failed, r.owner.as_deref(), r.lease_until, r.propagated), (0, None, None, 40));
    assert_eq!(r.last_error.as_deref(), Some("remote down"), "the last error stays");
    let owner = store
        .job_report("ARCHIVE", "a:1:x", t + 25 * SEC, Some(t + 40 * SEC), &report("FAILED", 0, 0, 0))
        .await
        .expect("report");
    assert_eq!(owner, None, "the holder learns its lease ended");
    assert!(store.job_lease("ARCHIVE", "a:1:x", t + 25 * SEC, t + 40 * SEC).await.expect("taken afresh"));
    assert!(!store.job_reset("NOBODY").await.expect("reset"), "no row, nothing reset");

    // A row goes only when its lease is the caller's or has ended.
    assert!(store.job_lease("OTHER", "a:1:x", t, t + 15 * SEC).await.expect("lease"));
    assert!(!store.job_forget("OTHER", "b:2:y", t + SEC).await.expect("forget"), "a's lease lasts");
    assert!(store.job_forget("OTHER", "b:2:y", t + 15 * SEC).await.expect("forget"), "a's lease ended");
    assert!(store.job_forget("OTHER", "b:2:y", t).await.expect("forget"), "already gone");
    assert_eq!(
        store.job_report("OTHER", "a:1:x", t, Some(t + SEC), &report("RUNNING", 1, 0, 0)).await.expect("r"),
        None
    );
    assert!(store.job_forget("ARCHIVE", "a:1:x", t + 26 * SEC).await.expect("the holder's own"));
    // A process sole on its store ends every lease at start.
    assert!(store.job_lease("ONE", "a:1:x", t, t + 15 * SEC).await.expect("lease"));
    assert!(store.job_lease("TWO", "a:1:x", t, t + 15 * SEC).await.expect("lease"));
    assert!(store.job_lease("THREE", "c:3:z", t, t + 15 * SEC).await.expect("lease"));
    // Only a named owner's leases end.
    assert_eq!(store.job_leases_clear(Some("c:3:z")).await.expect("clear c's"), 1);
    assert!(!store.job_lease("ONE", "b:2:y", t + SEC, t + 16 * SEC).await.expect("a's lease lasts"));
    assert!(store.job_lease("THREE", "b:2:y", t + SEC, t + 16 * SEC).await.expect("c's lease ended"));
    assert!(store.job_forget("THREE", "b:2:y", t + SEC).await.expect("forget"));
    assert_eq!(store.job_leases_clear(None).await.expect("clear"), 2);
    assert!(store.job_lease("ONE", "b:2:y", t + SEC, t + 16 * SEC).await.expect("free after the clear"));
    let names: Vec<String> = store.job_statuses().await.expect("statuses").into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["ONE", "TWO"]);
}

/// The backlog of a job: the committed messages of its consumer (delayed and in-flight ones
/// included), and when the oldest one it could take now became ready.
async fn propagation_job_backlog_counts_what_the_job_would_take(b: Backend) {
    let h = Harness::new(b).await;
    let store = h.engine.store().clone();
    let q = h.engine.resolved().ids[RAWQ];
    let t0 = h.clock.now();
    assert_eq!(store.job_backlog(q, "", t0, false).await.expect("backlog"), (0, None));
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(RAWQ, &[("", "01")], COMMIT)).await.expect("first");
    h.clock.advance_secs(10);
    h.run(&mut p, &raw_send(RAWQ, &[("", "02")], COMMIT)).await.expect("second");
    h.run(&mut p, &raw_send(RAWQ, &[("<delay>100</delay>", "03")], COMMIT)).await.expect("delayed");
    h.run(&mut p, &raw_send(RAWQ, &[("", "04")], "")).await.expect("uncommitted");
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", "").await, Ok("01".into()), "in flight: taken, not committed");
    let now = h.clock.now();
    assert_eq!(store.job_backlog(q, "", now, false).await.expect("backlog"), (3, Some(t0 + 10 * SEC)));
    // A job that takes messages still in their delay: the delayed one waits from its enqueue.
    assert_eq!(store.job_backlog(q, "", now, true).await.expect("backlog"), (3, Some(t0 + 10 * SEC)));
    h.clock.advance_secs(200);
    let now = h.clock.now();
    assert_eq!(store.job_backlog(q, "", now, false).await.expect("backlog"), (3, Some(t0 + 10 * SEC)));
    h.run(&mut c, &envelope(ROLLBACK)).await.expect("rollback");
    assert_eq!(store.job_backlog(q, "", now, false).await.expect("backlog"), (3, Some(t0)), "back in line");
    h.run(&mut p, &envelope(ROLLBACK)).await.expect("the fourth never was");
    assert_eq!(store.job_backlog(q, "", now, false).await.expect("backlog"), (3, Some(t0)));
    recv_raw(&h, &mut c, "", COMMIT).await.expect("take the first");
    assert_eq!(store.job_backlog(q, "", now, false).await.expect("backlog"), (2, Some(t0 + 10 * SEC)));
    recv_raw(&h, &mut c, "", COMMIT).await.expect("take the second");
    assert_eq!(
        store.job_backlog(q, "", now, false).await.expect("backlog"),
        (1, Some(t0 + 110 * SEC)),
        "its delay's end"
    );
    assert_eq!(store.job_backlog(q, "", now, true).await.expect("backlog"), (1, Some(t0 + 10 * SEC)), "its enqueue");
    // An expired message is the time manager's, not the job's.
    h.run(&mut p, &raw_send(RAWQ, &[("<expiration>5</expiration>", "05")], COMMIT)).await.expect("expiring");
    h.clock.advance_secs(6);
    let later = h.clock.now();
    assert_eq!(store.job_backlog(q, "", later, false).await.expect("backlog"), (2, Some(t0 + 110 * SEC)));

    // A multi-consumer queue: only the consumer's deliveries.
    let topic = h.engine.resolved().ids[TOPIC];
    let t1 = h.clock.now();
    h.run(&mut p, &publish_emp(10, "", COMMIT)).await.expect("to APP1");
    h.clock.advance_secs(5);
    let only_app2 = "<recipient_list><recipient><agent_name>APP2</agent_name></recipient></recipient_list>";
    h.run(&mut p, &publish_emp(20, only_app2, COMMIT)).await.expect("to APP2");
    let now = h.clock.now();
    assert_eq!(store.job_backlog(topic, "APP1", now, false).await.expect("backlog"), (1, Some(t1)));
    assert_eq!(store.job_backlog(topic, "APP2", now, true).await.expect("backlog"), (1, Some(t1 + 5 * SEC)));
    assert_eq!(store.job_backlog(topic, "NOBODY", now, false).await.expect("backlog"), (0, None));
}

/// Queues of queue tables with message grouping: one multi-consumer, one by priority.
const GROUPED: &str = r#"
[[queue_tables]]
name = "AQUSER.GRP_MC_TAB"
payload_type = "RAW"
multiple_consumers = true
message_grouping = "transactional"

[[queues]]
name = "AQUSER.GRP_MC"
queue_table = "AQUSER.GRP_MC_TAB"

[[subscribers]]
queue = "AQUSER.GRP_MC"
name = "APP1"

[[subscribers]]
queue = "AQUSER.GRP_MC"
name = "APP2"

[[queue_tables]]
name = "AQUSER.GRP_PRIO_TAB"
payload_type = "RAW"
sort_list = "priority,enq_time"
message_grouping = "TRANSACTIONAL"

[[queues]]
name = "AQUSER.GRP_PRIO"
queue_table = "AQUSER.GRP_PRIO_TAB"
"#;

async fn recv_from(h: &Harness, s: &mut aqgate_core::engine::Session, queue: &str, opts: &str) -> Result<String, i32> {
    match h.run(s, &receive(queue, &format!("<wait_time>0</wait_time>{opts}"), "")).await {
        Ok(r) => Ok(raw_of(&received(&r)[0])),
        Err((c, _)) => Err(c),
    }
}

async fn grouped_multi_consumer_queues_hold_a_group_per_consumer(b: Backend) {
    let h = Harness::with_topology(b, &format!("{}\n{GROUPED}", aqgate_admin::DEFAULT_TOPOLOGY)).await;
    let q = "AQUSER.GRP_MC";
    let mut p = h.session("scott");
    h.run(&mut p, &raw_send(q, &[("", "11"), ("<priority>2</priority>", "12")], "")).await.expect("send");
    h.run(&mut p, &raw_send(q, &[("", "13")], COMMIT)).await.expect("send and commit");
    h.run(&mut h.session("scott"), &raw_send(q, &[("", "21")], COMMIT)).await.expect("send");
    let (app1, app2) = ("<consumer_name>APP1</consumer_name>", "<consumer_name>APP2</consumer_name>");
    // APP1's first client holds the first group for APP1 only.
    let mut a1 = h.session("scott");
    assert_eq!(recv_from(&h, &mut a1, q, app1).await, Ok("11".into()));
    let mut b1 = h.session("scott");
    assert_eq!(recv_from(&h, &mut b1, q, app2).await, Ok("11".into()));
    let mut a2 = h.session("scott");
    assert_eq!(recv_from(&h, &mut a2, q, app1).await, Ok("21".into()));
    assert_eq!(recv_from(&h, &mut a2, q, app1).await, Err(code::FETCHED_ALL_IN_GROUP));
    assert_eq!(
        recv_from(&h, &mut a2, q, &format!("{app1}<navigation_mode>NEXT_TRANSACTION</navigation_mode>")).await,
        Err(code::NO_MESSAGE)
    );
    // A condition within the group: the next message of the group that matches it (12 is
    // passed, and NEXT_MESSAGE goes on from 13).
    assert_eq!(
        recv_from(&h, &mut a1, q, &format!("{app1}<selector><condition>tab.priority = 1</condition></selector>")).await,
        Ok("13".into())
    );
    assert_eq!(recv_from(&h, &mut a1, q, app1).await, Err(code::FETCHED_ALL_IN_GROUP));
    for s in [&mut a1, &mut a2, &mut b1] {
        h.run(s, &envelope(COMMIT)).await.expect("commit");
    }
    // APP2 still has 12, 13 (its group) and 21; APP1 has 12.
    let mut b2 = h.session("scott");
    for want in ["12", "13"] {
        assert_eq!(recv_from(&h, &mut b2, q, app2).await, Ok(want.into()));
    }
    assert_eq!(recv_from(&h, &mut b2, q, app2).await, Err(code::FETCHED_ALL_IN_GROUP));
    assert_eq!(
        recv_from(&h, &mut b2, q, &format!("{app2}<navigation_mode>NEXT_TRANSACTION</navigation_mode>")).await,
        Ok("21".into())
    );
    assert_eq!(recv_from(&h, &mut h.session("scott"), q, app1).await, Ok("12".into()));
}

async fn grouped_queues_order_groups_by_their_first_message(b: Backend) {
    let h = Harness::with_topology(b, &format!("{}\n{GROUPED}", aqgate_admin::DEFAULT_TOPOLOGY)).await;
    let q = "AQUSER.GRP_PRIO";
    let prio = |n: i64| format!("<priority>{n}</priority>");
    let (p5, p1, p2, p3) = (prio(5), prio(1), prio(2), prio(3));
    // Group P (priorities 5 and 1, one transaction), then group Q (3 and 2): P's first
    // message (priority 1) comes before Q's (priority 2).
    h.run(&mut h.session("scott"), &raw_send(q, &[(&p5, "A5"), (&p1, "A1")], COMMIT)).await.expect("send");
    h.run(&mut h.session("scott"), &raw_send(q, &[(&p3, "B3"), (&p2, "B2")], COMMIT)).await.expect("send");
    let mut c = h.session("scott");
    let browse = "<dequeue_mode>BROWSE</dequeue_mode>";
    assert_eq!(recv_from(&h, &mut c, q, browse).await, Ok("A1".into()));
    assert_eq!(recv_from(&h, &mut c, q, browse).await, Ok("A5".into()));
    assert_eq!(recv_from(&h, &mut c, q, browse).await, Err(code::FETCHED_ALL_IN_GROUP));
    let next_tx = "<navigation_mode>NEXT_TRANSACTION</navigation_mode>";
    assert_eq!(recv_from(&h, &mut c, q, &format!("{browse}{next_tx}")).await, Ok("B2".into()));
    assert_eq!(recv_from(&h, &mut c, q, browse).await, Ok("B3".into()));
    assert_eq!(recv_from(&h, &mut c, q, &format!("{browse}{next_tx}")).await, Err(code::NO_MESSAGE));
    // The session's group and position are kept in its row: a receive in a session
    // read back from the store continues in the group.
    let mut r = h.session("scott");
    assert_eq!(recv_from(&h, &mut r, q, "").await, Ok("A1".into()));
    let row = r.to_row().expect("a session with a lock has a row");
    let mut again = aqgate_core::engine::Session::from_row(&r.id, &row).expect("row reads back");
    assert_eq!(recv_from(&h, &mut again, q, "").await, Ok("A5".into()));
    assert_eq!(recv_from(&h, &mut again, q, "").await, Err(code::FETCHED_ALL_IN_GROUP));
    assert_eq!(recv_from(&h, &mut again, q, next_tx).await, Ok("B2".into()));
    h.run(&mut again, &envelope(COMMIT)).await.expect("commit");
    assert_eq!(recv_from(&h, &mut h.session("scott"), q, "<visibility>IMMEDIATE</visibility>").await, Ok("B3".into()));
}

/// An outbound gateway job's doubts outlive no message: `gateway_doubt_purge` forgets those
/// about messages that no longer wait for the job's consumer in its source (removed and
/// committed, expired into the exception queue, never there, not an AQ id, waiting for
/// another consumer only) and keeps those about messages still waiting, a batch in flight
/// included; `gateway_job_drop` deletes a removed job's doubts and marks, no other job's.
async fn gateway_doubts_go_with_their_messages_and_their_job(b: Backend) {
    let h = Harness::new(b).await;
    let store = h.engine.store().clone();
    let ids: std::collections::HashMap<String, i64> = store.queue_ids().await.expect("ids").into_iter().collect();
    let mut p = h.session("scott");
    let r = h
        .run(
            &mut p,
            &raw_send(RAWQ, &[("", "01"), ("", "02"), ("", "03"), ("<expiration>1</expiration>", "04")], COMMIT),
        )
        .await
        .expect("send");
    let sent = sent_ids(&r);
    let r = h
        .run(
            &mut p,
            &publish_emp(
                10,
                "<recipient_list><recipient><agent_name>APP2</agent_name></recipient></recipient_list>",
                COMMIT,
            ),
        )
        .await
        .expect("publish to APP2");
    let emp = sent_ids(&r);
    // 01 is removed and committed; 02 is in a batch in flight; 03 waits; 04 expires.
    let mut c = h.session("scott");
    assert_eq!(recv_raw(&h, &mut c, "", COMMIT).await, Ok("01".into()));
    let mut inflight = h.session("scott");
    assert_eq!(recv_raw(&h, &mut inflight, "", "").await, Ok("02".into()));
    h.clock.advance_secs(3);
    assert_eq!(h.engine.expire_messages().await.expect("tm"), 1);
    let now = h.clock.now();
    let mut doubts: Vec<String> = sent.clone();
    doubts.extend(["00000000000000000000000000000000".to_string(), "not-an-aq-id".to_string()]);
    store.gateway_doubt_put("JOB$RAW", &doubts, now).await.expect("doubts");
    store.gateway_doubt_put("JOB$EMP", &[emp[0].clone()], now).await.expect("doubts");
    store.gateway_doubt_put("JOB$OTHER", &[sent[0].clone()], now).await.expect("doubts");
    let n = store.gateway_doubt_purge("JOB$RAW", ids[RAWQ], "").await.expect("purge");
    assert_eq!(n, 4, "01 removed, 04 expired, a bogus and a non-AQ id");
    let mut kept: Vec<String> =
        store.gateway_doubts("JOB$RAW").await.expect("doubts").into_iter().map(|(i, _)| i).collect();
    kept.sort();
    let mut want = vec![sent[1].clone(), sent[2].clone()];
    want.sort();
    assert_eq!(kept, want, "the batch in flight and the waiting message keep their doubts");
    // The same message is waiting for APP2, not for APP1.
    assert_eq!(store.gateway_doubt_purge("JOB$EMP", ids[TOPIC], "APP2").await.expect("purge"), 0);
    assert_eq!(store.gateway_doubt_purge("JOB$EMP", ids[TOPIC], "APP1").await.expect("purge"), 1);
    // Another queue's id: not in this source.
    assert_eq!(store.gateway_doubt_purge("JOB$OTHER", ids[TOPIC], "APP2").await.expect("purge"), 1);
    // A removed job's rows go, and only its own.
    sql_on(
        &h,
        b,
        "INSERT INTO gateway_seen (job, broker_id, at) VALUES ('JOB$RAW', 's:1', 1), ('JOB$RAW', 's:2', 1), ('JOB$KEEP', 's:1', 1)",
    )
    .await;
    store.gateway_doubt_put("JOB$KEEP", &[sent[2].clone()], now).await.expect("doubts");
    assert_eq!(store.gateway_job_drop("JOB$RAW").await.expect("drop"), 4, "two doubts and two marks");
    assert!(store.gateway_doubts("JOB$RAW").await.expect("doubts").is_empty());
    assert!(store.gateway_seen("JOB$RAW", &["s:1".into(), "s:2".into()]).await.expect("seen").is_empty());
    assert_eq!(store.gateway_seen("JOB$KEEP", &["s:1".into()]).await.expect("seen"), vec!["s:1".to_string()]);
    assert_eq!(store.gateway_doubts("JOB$KEEP").await.expect("doubts").len(), 1);
    assert_eq!(store.gateway_job_drop("JOB$RAW").await.expect("drop"), 0);
    h.run(&mut inflight, &envelope(COMMIT)).await.expect("commit the batch");
}

/// The control plane's counters: every change of the stored topology bumps the topology
/// counter in its own transaction (a rolled-back one does not, nor an upsert that changes
/// nothing); a ping bumps the ping counter. Agent rows: written, answered (never moving an
/// answer back), listed, and forgotten with their link rows once old.
async fn control_counters_follow_the_topology_and_pings(b: Backend) {
    let h = Harness::new(b).await;
    let store = h.engine.store().clone();
    let (t0, p0) = store.control_counters().await.expect("counters");
    let put = |spec: &'static str| {
        let store = store.clone();
        async move {
            let mut tx = store.begin().await.expect("begin");
            tx.put_topology_object("propagation", "CP_JOB", spec).await.expect("put");
            tx.commit().await.expect("commit");
        }
    };
    put("{}").await;
    let (t1, _) = store.control_counters().await.expect("counters");
    assert!(t1 > t0, "an insert bumps it: {t0} -> {t1}");
    put("{}").await;
    assert_eq!(store.control_counters().await.expect("counters").0, t1, "the same spec again changes nothing");
    put("{\"x\":1}").await;
    let (t2, _) = store.control_counters().await.expect("counters");
    assert!(t2 > t1, "an update bumps it");
    let mut tx = store.begin().await.expect("begin");
    tx.delete_topology_object("propagation", "CP_JOB").await.expect("delete");
    tx.rollback().await.expect("rollback");
    assert_eq!(store.control_counters().await.expect("counters").0, t2, "a rolled-back change bumps nothing");
    let mut tx = store.begin().await.expect("begin");
    tx.delete_topology_object("propagation", "CP_JOB").await.expect("delete");
    tx.commit().await.expect("commit");
    let (t3, p3) = store.control_counters().await.expect("counters");
    assert!(t3 > t2, "a delete bumps it");
    assert_eq!(p3, p0, "no ping yet");
    let ping = store.control_ping().await.expect("ping");
    assert_eq!(ping, p0 + 1);
    assert_eq!(store.control_counters().await.expect("counters"), (t3, ping));

    let now = h.clock.now();
    let agent = aqgate_core::store::AgentStatus {
        owner: "node:42:abcd".into(),
        host: "node".into(),
        pid: 42,
        started_at: now,
        status: "RUNNING".into(),
        last_error: None,
        last_error_at: None,
        updated_at: now,
        alive_until: now + 15 * SEC,
        pong: 0,
    };
    store.agent_put(&agent).await.expect("put");
    store.agent_pong("node:42:abcd", ping).await.expect("pong");
    store.agent_pong("node:42:abcd", ping - 1).await.expect("an older pong");
    let again = aqgate_core::store::AgentStatus {
        status: "SHUTTING_DOWN".into(),
        last_error: Some("boom".into()),
        last_error_at: Some(now + SEC),
        updated_at: now + SEC,
        ..agent.clone()
    };
    store.agent_put(&again).await.expect("put");
    assert_eq!(store.agents().await.expect("agents"), vec![aqgate_core::store::AgentStatus { pong: ping, ..again }]);
    let link = aqgate_core::store::LinkStatus {
        name: "NATS".into(),
        owner: "node:42:abcd".into(),
        state: "CONNECTED".into(),
        last_error: None,
        last_error_at: None,
        since: now,
        updated_at: now,
        connections: 2,
    };
    store.gateway_link_put(&link).await.expect("link");
    assert_eq!(store.gateway_links().await.expect("links"), vec![link.clone()], "the connections too");
    assert_eq!(store.agents_purge(now).await.expect("purge"), 0, "not older than that");
    assert_eq!(store.agents_purge(now + 2 * SEC).await.expect("purge"), 1);
    assert!(store.agents().await.expect("agents").is_empty());
    assert!(store.gateway_links().await.expect("links").is_empty(), "its link rows went with it");
}
