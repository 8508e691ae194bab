-- Message grouping: the group of a message on a queue whose queue table has
-- message_grouping = "transactional" (every message one transaction enqueued to the queue);
-- NULL elsewhere, and then a message is a group of its own. Adding a NULL column rewrites
-- nothing.
ALTER TABLE messages ADD COLUMN grp bigint;
CREATE INDEX messages_grp ON messages (queue_id, grp) WHERE grp IS NOT NULL;
