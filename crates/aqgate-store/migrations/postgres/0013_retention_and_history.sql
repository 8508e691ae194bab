-- Oracle's PROCESSED messages and dequeue history.
--
-- A message removed from a queue with a `retention_time` is copied here by the trigger
-- `aqgate_retain` (defined with the topology, see `views.rs`), with the time it was
-- removed and when its retention ends (NULL: FOREVER). Nothing dequeues from this
-- table; the AQ$ views show its rows as PROCESSED, and the time manager deletes them
-- when their time is up.
CREATE TABLE processed_messages (
    seq             BIGINT PRIMARY KEY,
    msgid           BYTEA NOT NULL,
    queue_id        BIGINT NOT NULL,
    corrid          TEXT,
    priority        BIGINT NOT NULL,
    enq_time        BIGINT NOT NULL,
    delay_until     BIGINT,
    expire_at       BIGINT,
    sender          TEXT,
    enq_user_id     TEXT,
    exception_queue TEXT,
    payload         BYTEA NOT NULL,
    retry_count     BIGINT NOT NULL DEFAULT 0,
    deq_time        BIGINT NOT NULL,
    retain_until    BIGINT
);
CREATE INDEX processed_messages_until ON processed_messages(retain_until) WHERE retain_until IS NOT NULL;

-- Who dequeued a message, when, in which transaction, after how many failed attempts: one
-- row per (message, consumer; '' on a single-consumer queue), written by a REMOVE dequeue
-- on a multi-consumer queue or a queue with a retention time. A rolled-back dequeue's row
-- goes with the rollback. Kept while the message is in the queue or retained.
CREATE TABLE dequeue_history (
    msg_seq     BIGINT NOT NULL,
    consumer    TEXT NOT NULL,
    deq_time    BIGINT NOT NULL,
    deq_user_id TEXT,
    txn         TEXT,
    retry_count BIGINT NOT NULL,
    PRIMARY KEY (msg_seq, consumer)
);
CREATE INDEX dequeue_history_txn ON dequeue_history(txn) WHERE txn IS NOT NULL;
