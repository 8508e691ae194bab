-- Accepted mail, durably stored before the SMTP 250; worked off by the forwarding worker.
CREATE TABLE mail_spool (
    id              BIGSERIAL PRIMARY KEY,
    received_at     BIGINT NOT NULL,
    agent           TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    -- What recognises a re-sent copy: a digest of the mail body (the signed part and its
    -- signature), which outer headers such as Message-ID cannot change.
    dedupe_key      TEXT NOT NULL,
    reply_to        TEXT NOT NULL,
    subject         TEXT,
    idap            BYTEA NOT NULL,
    state           TEXT NOT NULL DEFAULT 'new',
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    response        BYTEA,
    last_error      TEXT,
    replies_wanted  BIGINT NOT NULL DEFAULT 1,
    replies_sent    BIGINT NOT NULL DEFAULT 0,
    UNIQUE (agent, dedupe_key)
);
CREATE INDEX mail_spool_due ON mail_spool(next_attempt_at) WHERE state = 'new' OR replies_sent < replies_wanted;
