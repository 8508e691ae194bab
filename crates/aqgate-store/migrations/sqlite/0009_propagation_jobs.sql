-- Propagation jobs: the lease that makes one process at a time run a job, and the job's
-- status as its holder reports it (every heartbeat), for `admin jobs` and `/metrics` in any
-- process. `lease_until` is microseconds of the holder's engine clock; a lease that ended
-- may be taken by another process. The row goes when the job leaves the topology.
CREATE TABLE propagation_jobs (
    name            TEXT PRIMARY KEY,
    owner           TEXT,
    lease_until     INTEGER,
    state           TEXT NOT NULL,
    propagated      INTEGER NOT NULL DEFAULT 0,
    failed          INTEGER NOT NULL DEFAULT 0,
    exceptions      INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    last_error_at   INTEGER,
    last_success_at INTEGER,
    updated_at      INTEGER NOT NULL
);
