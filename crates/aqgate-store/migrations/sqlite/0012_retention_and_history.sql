-- Oracle's PROCESSED messages and dequeue history.
--
-- A message removed from a queue with a `retention_time` is copied here by the trigger
-- `aqgate_retain` (defined with the topology, see `views.rs`), with the time it was
-- removed and when its retention ends (NULL: FOREVER). Nothing dequeues from this
-- table; the AQ$ views show its rows as PROCESSED, and the time manager deletes them
-- when their time is up.
CREATE TABLE processed_messages (
    seq             INTEGER PRIMARY KEY,
    msgid           BLOB NOT NULL,
    queue_id        INTEGER NOT NULL,
    corrid          TEXT,
    priority        INTEGER NOT NULL,
    enq_time        INTEGER NOT NULL,
    delay_until     INTEGER,
    expire_at       INTEGER,
    sender          TEXT,
    enq_user_id     TEXT,
    exception_queue TEXT,
    payload         BLOB NOT NULL,
    retry_count     INTEGER NOT NULL DEFAULT 0,
    deq_time        INTEGER NOT NULL,
    retain_until    INTEGER
);
CREATE INDEX processed_messages_until ON processed_messages(retain_until) WHERE retain_until IS NOT NULL;

-- Who dequeued a message, when, in which transaction, after how many failed attempts: one
-- row per (message, consumer; '' on a single-consumer queue), written by a REMOVE dequeue
-- on a multi-consumer queue or a queue with a retention time. A rolled-back dequeue's row
-- goes with the rollback. Kept while the message is in the queue or retained.
CREATE TABLE dequeue_history (
    msg_seq     INTEGER NOT NULL,
    consumer    TEXT NOT NULL,
    deq_time    INTEGER NOT NULL,
    deq_user_id TEXT,
    txn         TEXT,
    retry_count INTEGER NOT NULL,
    PRIMARY KEY (msg_seq, consumer)
);
CREATE INDEX dequeue_history_txn ON dequeue_history(txn) WHERE txn IS NOT NULL;
