-- aqgate store, SQLite flavour.
CREATE TABLE topology (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    PRIMARY KEY (kind, name)
);

CREATE TABLE queues (
    id   INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE
);

CREATE TABLE messages (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    msgid           BLOB NOT NULL UNIQUE,
    queue_id        INTEGER NOT NULL REFERENCES queues(id),
    corrid          TEXT,
    priority        INTEGER NOT NULL,
    enq_time        INTEGER NOT NULL,
    delay_until     INTEGER,
    expire_at       INTEGER,
    sender          TEXT,
    exception_queue TEXT,
    payload         BLOB NOT NULL,
    state           INTEGER NOT NULL DEFAULT 0,
    enq_txn         TEXT
);
CREATE INDEX messages_enq_txn ON messages(enq_txn) WHERE enq_txn IS NOT NULL;
CREATE INDEX messages_expire ON messages(expire_at) WHERE expire_at IS NOT NULL;

CREATE TABLE deliveries (
    msg_seq     INTEGER NOT NULL REFERENCES messages(seq) ON DELETE CASCADE,
    queue_id    INTEGER NOT NULL,
    consumer    TEXT NOT NULL,
    prio_key    INTEGER NOT NULL,
    retry_count INTEGER NOT NULL DEFAULT 0,
    lock_txn    TEXT,
    lock_kind   INTEGER,
    PRIMARY KEY (msg_seq, consumer)
);
CREATE INDEX deliveries_order ON deliveries(queue_id, consumer, prio_key, msg_seq);
CREATE INDEX deliveries_lock ON deliveries(lock_txn) WHERE lock_txn IS NOT NULL;

CREATE TABLE registrations (
    queue_id   INTEGER NOT NULL REFERENCES queues(id),
    consumer   TEXT NOT NULL,
    notify_url TEXT NOT NULL,
    agent      TEXT NOT NULL,
    PRIMARY KEY (queue_id, consumer, notify_url)
);
