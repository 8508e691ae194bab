-- Who claimed a spooled mail (`host:pid:random`): a process restarted after a crash takes
-- back the claims of its dead predecessor at once instead of waiting out their lease.
ALTER TABLE mail_spool ADD COLUMN claimed_by TEXT;
