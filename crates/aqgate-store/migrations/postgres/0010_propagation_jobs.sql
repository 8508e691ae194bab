-- Propagation jobs: the lease that makes one process at a time run a job, and the job's
-- status as its holder reports it (every heartbeat), for `admin jobs` and `/metrics` in any
-- process. `lease_until` is microseconds of the holder's engine clock; a lease that ended
-- may be taken by another process. The row goes when the job leaves the topology.
CREATE TABLE propagation_jobs (
    name            TEXT PRIMARY KEY,
    owner           TEXT,
    lease_until     BIGINT,
    state           TEXT NOT NULL,
    propagated      BIGINT NOT NULL DEFAULT 0,
    failed          BIGINT NOT NULL DEFAULT 0,
    exceptions      BIGINT NOT NULL DEFAULT 0,
    last_error      TEXT,
    last_error_at   BIGINT,
    last_success_at BIGINT,
    updated_at      BIGINT NOT NULL
);
