-- What the AQ$ views show of buffered messages held in a process's memory: each serving
-- process replaces its own rows (`node`) after its buffers change, and rewrites them every
-- few seconds while it holds any; rows not rewritten for a few seconds are an ended
-- process's, which the views leave out and the next write of any process deletes. Bounded
-- per process (rows and payload bytes); one row per consumer of each message.
CREATE TABLE buffered_messages (
    node            TEXT NOT NULL,
    queue_id        INTEGER NOT NULL,
    msgid           BLOB NOT NULL,
    consumer        TEXT NOT NULL,
    corrid          TEXT,
    priority        INTEGER NOT NULL,
    enq_time        INTEGER NOT NULL,
    delay_until     INTEGER,
    expire_at       INTEGER,
    sender          TEXT,
    enq_user_id     TEXT,
    exception_queue TEXT,
    payload         BLOB,
    enq_txn_id      TEXT,
    orig_msgid      BLOB,
    orig_queue_id   INTEGER,
    exc_reason      INTEGER,
    exc_retries     INTEGER,
    state           INTEGER NOT NULL DEFAULT 0,
    retry_count     INTEGER NOT NULL DEFAULT 0,
    seen_at         INTEGER NOT NULL
);
CREATE INDEX buffered_messages_node ON buffered_messages(node);
CREATE INDEX buffered_messages_queue ON buffered_messages(queue_id);
