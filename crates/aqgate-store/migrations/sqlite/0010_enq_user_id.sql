-- The agent a message was enqueued by (Oracle's ENQ_USER_ID): the authenticated agent of
-- the request that sent it, kept apart from `sender`, which is what the application said
-- (`sender_id`). A propagation job's local copy keeps its source message's. NULL on rows
-- written before the column existed.
ALTER TABLE messages ADD COLUMN enq_user_id TEXT;
