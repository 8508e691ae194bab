-- A consumer of a multi-consumer message that failed its dequeues more than the queue's
-- max_retries gives up on it: its delivery stays, marked, so that the message, which that
-- consumer never processed, moves to its exception queue once the other consumers are done
-- with it (the remove of the last of them), instead of being deleted. No dequeue takes or
-- browses a given-up delivery; the AQ$ views show it as UNDELIVERABLE.
ALTER TABLE deliveries ADD COLUMN gave_up INTEGER NOT NULL DEFAULT 0;
