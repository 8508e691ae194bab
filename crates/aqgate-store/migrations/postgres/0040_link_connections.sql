-- The connections a process has open to a gateway link's broker (admin gateway's
-- CONNECTIONS): the jobs of a link share up to its max_connections of them.
ALTER TABLE gateway_links ADD COLUMN connections BIGINT NOT NULL DEFAULT 0;
