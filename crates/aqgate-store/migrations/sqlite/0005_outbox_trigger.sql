-- The outbox rows of an enqueue, written by a trigger on its deliveries: inside the same
-- statement (and transaction) as the insert, without another statement per request.
-- Messages moved to an exception queue (state 3) do not notify, as on PostgreSQL.
CREATE TRIGGER notify_outbox_on_delivery AFTER INSERT ON deliveries
BEGIN
    INSERT INTO notify_outbox (queue_id, consumer, agent, notify_url, msgid, corrid, priority, enq_time,
                               delay_until, expire_at, sender, exception_queue, txn, next_attempt_at)
    SELECT m.queue_id, NEW.consumer, r.agent, r.notify_url, m.msgid, m.corrid, m.priority, m.enq_time,
           m.delay_until, m.expire_at, m.sender, m.exception_queue, m.enq_txn, COALESCE(m.delay_until, m.enq_time)
    FROM registrations r JOIN messages m ON m.seq = NEW.msg_seq
    WHERE r.queue_id = NEW.queue_id AND r.consumer = NEW.consumer AND m.state = 0;
END;
