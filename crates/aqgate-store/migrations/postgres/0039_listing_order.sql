-- `admin messages` pages through a queue in dequeue order: a multi-consumer queue's
-- messages by (queue, prio_key, seq), as messages_single_order has a single-consumer
-- queue's, and the messages a queue kept after their removal oldest first. (The views find
-- a queue's messages through the same indexes.)
DROP INDEX IF EXISTS messages_multi_queue;
CREATE INDEX messages_multi_order ON messages(queue_id, prio_key, seq) WHERE NOT single;
DROP INDEX IF EXISTS processed_messages_queue;
CREATE INDEX processed_messages_queue ON processed_messages(queue_id, seq);
