-- Registrations are keyed by (queue, consumer, registering agent): registering again
-- replaces the agent's notify_url. An optional secret signs HTTP notifications (HMAC).
CREATE TABLE registrations_v2 (
    queue_id   INTEGER NOT NULL REFERENCES queues(id),
    consumer   TEXT NOT NULL,
    agent      TEXT NOT NULL,
    notify_url TEXT NOT NULL,
    secret     TEXT,
    PRIMARY KEY (queue_id, consumer, agent)
);
INSERT OR REPLACE INTO registrations_v2 (queue_id, consumer, agent, notify_url)
    SELECT queue_id, consumer, agent, notify_url FROM registrations ORDER BY notify_url;
DROP TABLE registrations;
ALTER TABLE registrations_v2 RENAME TO registrations;

-- Transactional outbox: one row per (message, registration), written in the transaction
-- that inserts the message. `txn` is the session transaction while the enqueue is not
-- committed (published by commit, deleted by rollback and recovery, like messages.enq_txn).
-- The message's properties are copied: the message may be dequeued before the
-- notification goes out. Delivered rows are deleted; `parked` rows wait for an operator.
CREATE TABLE notify_outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    queue_id        INTEGER NOT NULL,
    consumer        TEXT NOT NULL,
    agent           TEXT NOT NULL,
    notify_url      TEXT NOT NULL,
    msgid           BLOB NOT NULL,
    corrid          TEXT,
    priority        INTEGER NOT NULL,
    enq_time        INTEGER NOT NULL,
    delay_until     INTEGER,
    expire_at       INTEGER,
    sender          TEXT,
    exception_queue TEXT,
    txn             TEXT,
    state           TEXT NOT NULL DEFAULT 'new',
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT
);
CREATE INDEX notify_outbox_due ON notify_outbox(next_attempt_at, id) WHERE state = 'new' AND txn IS NULL;
CREATE INDEX notify_outbox_txn ON notify_outbox(txn) WHERE txn IS NOT NULL;
