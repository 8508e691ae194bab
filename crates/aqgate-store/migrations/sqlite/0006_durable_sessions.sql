-- Sessions live in the store, written in the same transaction as each request's effects,
-- so that a restart (or another node) continues them. The id is kept only as its SHA-256.
CREATE TABLE sessions (
    id_hash   BLOB PRIMARY KEY,
    agent     TEXT NOT NULL,
    txn       TEXT NOT NULL,
    pending   INTEGER NOT NULL,
    dequeued  INTEGER NOT NULL,
    enqueued  INTEGER NOT NULL,
    -- Navigation positions: JSON [[queue, consumer, prio_key, seq], ...].
    positions TEXT NOT NULL,
    last_used INTEGER NOT NULL,
    -- Bumped by every write: a write that finds another version lost a race and rolls back.
    version   INTEGER NOT NULL
);
CREATE INDEX sessions_idle ON sessions(last_used);

-- Sessions that ended by timing out, so their cookie answers "expired" (and not "unknown")
-- until `until`.
CREATE TABLE session_tombstones (
    id_hash  BLOB PRIMARY KEY,
    agent    TEXT NOT NULL,
    had_work INTEGER NOT NULL,
    until    INTEGER NOT NULL
);
CREATE INDEX session_tombstones_until ON session_tombstones(until);

-- Requests performed under an idempotency key (the Idempotency-Key header, the mail
-- worker's spool row): the response is written in the request's own transaction.
CREATE TABLE idempotency (
    agent        TEXT NOT NULL,
    key          TEXT NOT NULL,
    request_hash BLOB NOT NULL,
    response     BLOB NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (agent, key)
);
CREATE INDEX idempotency_created ON idempotency(created_at);
