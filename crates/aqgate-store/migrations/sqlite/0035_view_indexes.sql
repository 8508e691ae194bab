-- The AQ$ views find the messages a queue kept after their removal through an index, not
-- a scan of every queue's (its live ones come through deliveries_order).
CREATE INDEX processed_messages_queue ON processed_messages(queue_id);
