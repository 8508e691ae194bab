-- The Messaging Gateway.
-- gateway_doubt: an outbound job's messages it is about to publish, committed before the
-- publish and deleted once their dequeue committed. A row whose message is still in the
-- source (the process died in between) says the broker may have it: in doubt.
CREATE TABLE gateway_doubt (
    job        TEXT NOT NULL,
    message_id TEXT NOT NULL,
    since      BIGINT NOT NULL,
    PRIMARY KEY (job, message_id)
);
-- gateway_seen: the broker messages an inbound job enqueued, written in the enqueue's own
-- transaction, so that a redelivery of one (the process died before its ack) is acked
-- without a second enqueue. Forgotten after the idempotency window.
CREATE TABLE gateway_seen (
    job       TEXT NOT NULL,
    broker_id TEXT NOT NULL,
    at        BIGINT NOT NULL,
    PRIMARY KEY (job, broker_id)
);
CREATE INDEX gateway_seen_at ON gateway_seen (at);
-- gateway_links: each process's view of each link it uses (admin gateway).
CREATE TABLE gateway_links (
    name          TEXT NOT NULL,
    owner         TEXT NOT NULL,
    state         TEXT NOT NULL,
    last_error    TEXT,
    last_error_at BIGINT,
    since         BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (name, owner)
);
