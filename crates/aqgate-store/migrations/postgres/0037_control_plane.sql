-- The control plane: what running nodes follow without a signal.
-- control_plane: one row of counters. `topology` goes up with every change of the stored
-- topology (the trigger below, in the changing transaction), `ping` with every
-- `admin gateway --ping`; every change of the row NOTIFYs aqgate_control at its commit
-- (one signal per transaction: the payloads are equal), and each node reads the row then
-- (and every few seconds besides) and reloads its topology, or answers the ping.
CREATE TABLE control_plane (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    topology BIGINT NOT NULL,
    ping     BIGINT NOT NULL
);
INSERT INTO control_plane (id, topology, ping) VALUES (1, 0, 0);
CREATE FUNCTION aqgate_topology_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE control_plane SET topology = topology + 1 WHERE id = 1;
    RETURN NULL;
END
$$;
CREATE TRIGGER topology_inserted_or_deleted AFTER INSERT OR DELETE ON topology
    FOR EACH ROW EXECUTE FUNCTION aqgate_topology_changed();
CREATE TRIGGER topology_updated AFTER UPDATE ON topology
    FOR EACH ROW WHEN (OLD.spec IS DISTINCT FROM NEW.spec) EXECUTE FUNCTION aqgate_topology_changed();
CREATE FUNCTION aqgate_control_signal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('aqgate_control', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER control_signal AFTER UPDATE ON control_plane
    FOR EACH ROW EXECUTE FUNCTION aqgate_control_signal();
-- gateway_agents: each process that runs propagation jobs (the Messaging Gateway's agent),
-- its instance, status and last error, refreshed with its heartbeat until alive_until;
-- pong: the last ping it answered.
CREATE TABLE gateway_agents (
    owner         TEXT PRIMARY KEY,
    host          TEXT NOT NULL,
    pid           BIGINT NOT NULL,
    started_at    BIGINT NOT NULL,
    status        TEXT NOT NULL,
    last_error    TEXT,
    last_error_at BIGINT,
    updated_at    BIGINT NOT NULL,
    alive_until   BIGINT NOT NULL,
    pong          BIGINT NOT NULL DEFAULT 0
);
