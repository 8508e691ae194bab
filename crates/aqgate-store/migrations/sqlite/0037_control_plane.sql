-- The control plane: what running nodes follow without a signal.
-- control_plane: one row of counters. `topology` goes up with every change of the stored
-- topology (the triggers below, in the changing transaction), `ping` with every
-- `admin gateway --ping`; each node reads the row every few hundred milliseconds and
-- reloads its topology, or answers the ping, when a counter moved.
CREATE TABLE control_plane (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    topology INTEGER NOT NULL,
    ping     INTEGER NOT NULL
);
INSERT INTO control_plane (id, topology, ping) VALUES (1, 0, 0);
CREATE TRIGGER topology_inserted AFTER INSERT ON topology
BEGIN
    UPDATE control_plane SET topology = topology + 1 WHERE id = 1;
END;
CREATE TRIGGER topology_updated AFTER UPDATE ON topology WHEN OLD.spec IS NOT NEW.spec
BEGIN
    UPDATE control_plane SET topology = topology + 1 WHERE id = 1;
END;
CREATE TRIGGER topology_deleted AFTER DELETE ON topology
BEGIN
    UPDATE control_plane SET topology = topology + 1 WHERE id = 1;
END;
-- gateway_agents: each process that runs propagation jobs (the Messaging Gateway's agent),
-- its instance, status and last error, refreshed with its heartbeat until alive_until;
-- pong: the last ping it answered.
CREATE TABLE gateway_agents (
    owner         TEXT PRIMARY KEY,
    host          TEXT NOT NULL,
    pid           INTEGER NOT NULL,
    started_at    INTEGER NOT NULL,
    status        TEXT NOT NULL,
    last_error    TEXT,
    last_error_at INTEGER,
    updated_at    INTEGER NOT NULL,
    alive_until   INTEGER NOT NULL,
    pong          INTEGER NOT NULL DEFAULT 0
);
