-- What operators did to messages through `aqgate admin` (a replay from an exception queue):
-- who (the name given with --as), when, to which queue, how many, with which filter, and
-- the message ids moved (at most 100 per row; `ids_more` counts the rest). Written in the
-- transaction that does the work, so a row is there exactly when its work is.
CREATE TABLE audit_log (
    id        BIGSERIAL PRIMARY KEY,
    at        BIGINT NOT NULL,
    actor     TEXT NOT NULL,
    action    TEXT NOT NULL,
    queue     TEXT NOT NULL,
    target    TEXT,
    count     BIGINT NOT NULL,
    filter    TEXT NOT NULL,
    run       TEXT NOT NULL,
    msgids    TEXT NOT NULL,
    ids_more  BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX audit_log_at ON audit_log(at);
