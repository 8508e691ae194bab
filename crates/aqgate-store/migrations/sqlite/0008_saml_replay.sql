-- SAML assertions already used to log in (the replay cache), shared by every node of the
-- database. A row is kept until the assertion's end of validity plus the clock skew
-- (`until`, microseconds), then the time manager's purge forgets it.
CREATE TABLE saml_replay (
    issuer       TEXT NOT NULL,
    assertion_id TEXT NOT NULL,
    until        INTEGER NOT NULL,
    PRIMARY KEY (issuer, assertion_id)
);
CREATE INDEX saml_replay_until ON saml_replay(until);
