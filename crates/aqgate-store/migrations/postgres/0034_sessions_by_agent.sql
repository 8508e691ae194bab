-- Each agent's open sessions are counted (its share, --max-sessions-per-agent) when it opens
-- another one. The agent of a row never changes: its updates stay HOT.
CREATE INDEX sessions_agent ON sessions(agent);
