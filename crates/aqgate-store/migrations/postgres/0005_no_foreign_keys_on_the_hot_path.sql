-- Foreign-key checks run per inserted row as triggers (an SPI query each; the one on
-- deliveries also locks the message row it has just inserted): a third of PostgreSQL's
-- time in batch enqueues. The store keeps these relations itself: queue ids come from
-- the queues table, and every statement that deletes messages deletes their deliveries
-- in the same statement (there is no ON DELETE CASCADE to rely on any more).
ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_msg_seq_fkey;
ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_queue_id_fkey;
