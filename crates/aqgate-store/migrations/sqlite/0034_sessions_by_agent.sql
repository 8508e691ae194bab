-- Each agent's open sessions are counted (its share, --max-sessions-per-agent) when it opens
-- another one.
CREATE INDEX sessions_agent ON sessions(agent);
