-- Sessions live in the store, written in the same transaction as each request's effects,
-- so that a restart or any other node continues them. The id is kept only as its SHA-256.
CREATE TABLE sessions (
    id_hash    BYTEA PRIMARY KEY,
    agent      TEXT NOT NULL,
    txn        TEXT NOT NULL,
    pending    BOOLEAN NOT NULL,
    dequeued   BOOLEAN NOT NULL,
    enqueued   BIGINT NOT NULL,
    -- Navigation positions: JSON [[queue, consumer, prio_key, seq], ...].
    positions  TEXT NOT NULL,
    last_used  BIGINT NOT NULL,
    -- Bumped by every write: a write that finds another version lost a race and rolls back.
    version    BIGINT NOT NULL,
    -- The server run (pg_postmaster_start_time()) of the row's last write: a crash loses
    -- provisional (synchronous_commit off) writes, always the newest ones, so a row last
    -- written in another run may have lost writes of its open transaction.
    epoch      TIMESTAMPTZ NOT NULL,
    -- Set by a write that found the row so; cleared when the transaction ends. Such a
    -- session's commit is refused (25402).
    doubt      BOOLEAN NOT NULL DEFAULT false
-- Every request of a session rewrites its row: room on the page and no index on a column
-- that changes (last_used) keep those updates HOT (no new index entries). The idle scan
-- (once a second) reads the table, which holds only the sessions open now.
) WITH (fillfactor = 50);

-- Sessions that ended by timing out, so their cookie answers "expired" (and not "unknown")
-- until `until`.
CREATE TABLE session_tombstones (
    id_hash  BYTEA PRIMARY KEY,
    agent    TEXT NOT NULL,
    had_work BOOLEAN NOT NULL,
    until    BIGINT NOT NULL
);
CREATE INDEX session_tombstones_until ON session_tombstones(until);

-- Requests performed under an idempotency key (the Idempotency-Key header, the mail
-- worker's spool row): the response is written in the request's own transaction.
CREATE TABLE idempotency (
    agent        TEXT NOT NULL,
    key          TEXT NOT NULL,
    request_hash BYTEA NOT NULL,
    response     BYTEA NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (agent, key)
);
CREATE INDEX idempotency_created ON idempotency(created_at);
