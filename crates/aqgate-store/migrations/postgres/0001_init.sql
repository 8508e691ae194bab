-- aqgate store, PostgreSQL flavour.
CREATE TABLE topology (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    PRIMARY KEY (kind, name)
);

CREATE TABLE queues (
    id   BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);

CREATE TABLE messages (
    seq             BIGSERIAL PRIMARY KEY,
    msgid           BYTEA NOT NULL UNIQUE,
    queue_id        BIGINT NOT NULL REFERENCES queues(id),
    corrid          TEXT,
    priority        BIGINT NOT NULL,
    enq_time        BIGINT NOT NULL,
    delay_until     BIGINT,
    expire_at       BIGINT,
    sender          TEXT,
    exception_queue TEXT,
    payload         BYTEA NOT NULL,
    state           BIGINT NOT NULL DEFAULT 0,
    enq_txn         TEXT
);
CREATE INDEX messages_enq_txn ON messages(enq_txn) WHERE enq_txn IS NOT NULL;
CREATE INDEX messages_expire ON messages(expire_at) WHERE expire_at IS NOT NULL;

CREATE TABLE deliveries (
    msg_seq     BIGINT NOT NULL REFERENCES messages(seq) ON DELETE CASCADE,
    queue_id    BIGINT NOT NULL,
    consumer    TEXT NOT NULL,
    prio_key    BIGINT NOT NULL,
    retry_count BIGINT NOT NULL DEFAULT 0,
    lock_txn    TEXT,
    lock_kind   BIGINT,
    PRIMARY KEY (msg_seq, consumer)
);
CREATE INDEX deliveries_order ON deliveries(queue_id, consumer, prio_key, msg_seq);
CREATE INDEX deliveries_lock ON deliveries(lock_txn) WHERE lock_txn IS NOT NULL;

CREATE TABLE registrations (
    queue_id   BIGINT NOT NULL REFERENCES queues(id),
    consumer   TEXT NOT NULL,
    notify_url TEXT NOT NULL,
    agent      TEXT NOT NULL,
    PRIMARY KEY (queue_id, consumer, notify_url)
);
