-- The worker's "what is due" query walks this index in its order (next attempt, then id)
-- and its predicate is the query's, word for word: finished mails, kept for the dedupe
-- window, are never scanned.
DROP INDEX mail_spool_due;
CREATE INDEX mail_spool_due ON mail_spool(next_attempt_at, id) WHERE state = 'new' OR replies_sent < replies_wanted;
