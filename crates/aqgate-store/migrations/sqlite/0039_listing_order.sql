-- `admin messages` pages through the messages a queue kept after their removal oldest
-- first (a queue's live messages come in dequeue order through deliveries_order).
DROP INDEX IF EXISTS processed_messages_queue;
CREATE INDEX processed_messages_queue ON processed_messages(queue_id, seq);
