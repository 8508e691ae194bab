-- Registrations are keyed by (queue, consumer, registering agent): registering again
-- replaces the agent's notify_url. An optional secret signs HTTP notifications (HMAC).
CREATE TABLE registrations_v2 (
    queue_id   BIGINT NOT NULL REFERENCES queues(id),
    consumer   TEXT NOT NULL,
    agent      TEXT NOT NULL,
    notify_url TEXT NOT NULL,
    secret     TEXT,
    PRIMARY KEY (queue_id, consumer, agent)
);
INSERT INTO registrations_v2 (queue_id, consumer, agent, notify_url)
    SELECT DISTINCT ON (queue_id, consumer, agent) queue_id, consumer, agent, notify_url
    FROM registrations ORDER BY queue_id, consumer, agent, notify_url DESC;
DROP TABLE registrations;
ALTER TABLE registrations_v2 RENAME TO registrations;
ALTER TABLE registrations RENAME CONSTRAINT registrations_v2_pkey TO registrations_pkey;

-- Transactional outbox: one row per (message, registration), written in the transaction
-- that inserts the message. `txn` is the session transaction while the enqueue is not
-- committed (published by commit, deleted by rollback and recovery, like messages.enq_txn).
-- The message's properties are copied: the message may be dequeued before the
-- notification goes out. Delivered rows are deleted; `parked` rows wait for an operator.
CREATE TABLE notify_outbox (
    id              BIGSERIAL PRIMARY KEY,
    queue_id        BIGINT NOT NULL,
    consumer        TEXT NOT NULL,
    agent           TEXT NOT NULL,
    notify_url      TEXT NOT NULL,
    msgid           BYTEA NOT NULL,
    corrid          TEXT,
    priority        BIGINT NOT NULL,
    enq_time        BIGINT NOT NULL,
    delay_until     BIGINT,
    expire_at       BIGINT,
    sender          TEXT,
    exception_queue TEXT,
    txn             TEXT,
    state           TEXT NOT NULL DEFAULT 'new',
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    last_error      TEXT
);
CREATE INDEX notify_outbox_due ON notify_outbox(next_attempt_at, id) WHERE state = 'new' AND txn IS NULL;
CREATE INDEX notify_outbox_txn ON notify_outbox(txn) WHERE txn IS NOT NULL;
