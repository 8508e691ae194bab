-- What Oracle's AQ$<QUEUE_TABLE> views show beyond the queue itself: the transaction that
-- enqueued a message (ENQ_TXN_ID); for a copy a propagation job made, the message and queue
-- it copies (ORIGINAL_MSGID, ORIGINAL_QUEUE_NAME); for a message in an exception queue, the
-- queue it left, why (EXPIRATION_REASON: 1 TIME_EXPIRATION, 2 MAX_RETRY_EXCEEDED,
-- 3 PROPAGATION_FAILURE, 4 INVALID_TRANSFORMATION) and the failed dequeues it had there.
-- A retained message keeps them.
-- (Nullable columns without a default: adding them rewrites nothing.)
ALTER TABLE messages ADD COLUMN enq_txn_id TEXT,
    ADD COLUMN orig_msgid BYTEA,
    ADD COLUMN orig_queue_id BIGINT,
    ADD COLUMN exc_reason BIGINT,
    ADD COLUMN exc_retries BIGINT;
ALTER TABLE processed_messages ADD COLUMN enq_txn_id TEXT,
    ADD COLUMN orig_msgid BYTEA,
    ADD COLUMN orig_queue_id BIGINT,
    ADD COLUMN exc_reason BIGINT,
    ADD COLUMN exc_retries BIGINT;
