-- The AQ$ views find a queue's rows through indexes, whatever the planner's statistics
-- say (a database nobody has analyzed estimates every filter as selective, and plans
-- nested loops): the multi-consumer messages of a queue here (the single-consumer ones
-- through messages_single_order), their deliveries through the primary key, and the
-- messages kept after their removal through processed_messages_queue. One entry per
-- multi-consumer message (its deliveries have two per consumer); single-consumer
-- enqueues do not touch it.
CREATE INDEX messages_multi_queue ON messages(queue_id) WHERE NOT single;
CREATE INDEX processed_messages_queue ON processed_messages(queue_id);
