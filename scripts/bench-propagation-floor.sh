#!/usr/bin/env bash
# What moving a batch of messages costs PostgreSQL itself, without aqgate: the floor under
# a local propagation job's rate (see BENCHMARKS.md, "Propagation"). One pgbench client
# moves BATCH rows of 1 KiB at a time, in order, from one table to another, committed
# durably, two ways:
#   steps — the statements a job's batch makes, each a round trip: BEGIN; SELECT … FOR
#           UPDATE SKIP LOCKED; DELETE; INSERT; COMMIT;
#   one   — a single statement (DELETE … RETURNING feeding the INSERT) and its commit.
# Each round starts from fresh tables of ROWS rows.
# Usage: scripts/bench-propagation-floor.sh ROUNDS SECONDS [BATCH] [ROWS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=$1; secs=$2; batch=${3:-30}; rows=${4:-400000}
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
db="$pg/aqgate_bench_floor"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/steps.sql" <<SQL
BEGIN;
SELECT seq FROM src ORDER BY prio, seq LIMIT $batch FOR UPDATE SKIP LOCKED;
DELETE FROM src WHERE seq IN (SELECT seq FROM src ORDER BY prio, seq LIMIT $batch);
INSERT INTO dst (prio, payload) SELECT 0, decode(repeat('ab', 1024), 'hex') FROM generate_series(1, $batch);
COMMIT;
SQL
cat >"$dir/one.sql" <<SQL
WITH d AS (DELETE FROM src WHERE seq IN (SELECT seq FROM src ORDER BY prio, seq LIMIT $batch FOR UPDATE SKIP LOCKED)
           RETURNING prio, payload)
INSERT INTO dst (prio, payload) SELECT prio, payload FROM d;
SQL
for r in $(seq 1 "$rounds"); do
  for way in steps one; do
    PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_floor' \
      -c 'CREATE DATABASE aqgate_bench_floor' >/dev/null
    psql "$db" -q -v ON_ERROR_STOP=1 <<SQL
CREATE TABLE src (seq bigserial PRIMARY KEY, prio bigint NOT NULL DEFAULT 0, payload bytea NOT NULL);
CREATE TABLE dst (seq bigserial PRIMARY KEY, prio bigint NOT NULL DEFAULT 0, payload bytea NOT NULL);
CREATE INDEX src_order ON src (prio, seq);
INSERT INTO src (payload) SELECT decode(repeat('ab', 1024), 'hex') FROM generate_series(1, $rows);
VACUUM ANALYZE src;
SQL
    tps=$(pgbench -n -c 1 -T "$secs" -M prepared -f "$dir/$way.sql" "$db" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    printf 'round=%s way=%-5s batch=%s batches/s=%.0f msgs/s=%.0f\n' "$r" "$way" "$batch" "$tps" "$(echo "$tps * $batch" | bc -l)"
  done
done
