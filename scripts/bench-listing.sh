#!/usr/bin/env bash
# `admin messages` and the AQ$ views on large queues, on a fresh PostgreSQL database that
# has never been analyzed (autovacuum off on its tables): 1,000,000 messages with 3
# consumers each in AQUSER.EMP_TOPIC, 1,000,000 in AQUSER.RAW_QUE and one WAIT message
# behind them. Prints the wall time of each command, twice.
#   scripts/bench-listing.sh [BINARY]     (default target/release/aqgate)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/aqgate}
ADMIN_URL=${AQGATE_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
DB=aqgate_bench_listing_$$
psql -q "$ADMIN_URL" -c "CREATE DATABASE $DB"
URL="${ADMIN_URL%/*}/$DB"
trap 'psql -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $DB"' EXIT
"$BIN" admin apply config/topology.toml --database "$URL" >/dev/null
psql -q "$URL" -c "ALTER TABLE messages SET (autovacuum_enabled = false); ALTER TABLE deliveries SET (autovacuum_enabled = false);"
T=$(psql -Atq "$URL" -c "SELECT id FROM queues WHERE name = 'AQUSER.EMP_TOPIC'")
R=$(psql -Atq "$URL" -c "SELECT id FROM queues WHERE name = 'AQUSER.RAW_QUE'")
NOW=$(date +%s%6N)
psql -q "$URL" <<SQL
INSERT INTO messages (msgid, queue_id, corrid, priority, enq_time, payload, single, prio_key, enq_user_id, enq_txn_id)
SELECT decode(md5('t' || g), 'hex'), $T, 'C' || g, 1, $NOW - 10000000000 + g,
       convert_to('<EMP_TYP><EMPNO>1</EMPNO></EMP_TYP>', 'UTF8'), false, 0, 'SCOTT', md5('x' || (g / 10))
FROM generate_series(1, 1000000) g;
INSERT INTO deliveries (msg_seq, queue_id, consumer, prio_key)
SELECT m.seq, $T, c, 0 FROM messages m, unnest(ARRAY['APP1','APP2','APP3']) c WHERE m.queue_id = $T;
INSERT INTO messages (msgid, queue_id, corrid, priority, enq_time, payload, single, prio_key, enq_user_id)
SELECT decode(md5('r' || g), 'hex'), $R, 'R' || g, 1, $NOW - 10000000000 + g, '\x01', true, 1, 'SCOTT'
FROM generate_series(1, 1000000) g;
INSERT INTO messages (msgid, queue_id, corrid, priority, enq_time, delay_until, payload, single, prio_key, enq_user_id)
VALUES (decode(md5('w1'), 'hex'), $R, 'W1', 1, $NOW, $NOW + 3600000000, '\x02', true, 1, 'SCOTT');
SQL
psql -Atq "$URL" -c "SELECT relname, n_live_tup, coalesce(last_analyze::text, 'never analyzed') FROM pg_stat_user_tables WHERE relname IN ('messages', 'deliveries')"
t() {
  local s; s=$(date +%s%N)
  "$@" >/dev/null 2>&1
  echo "$(( ($(date +%s%N) - s) / 1000000 )) ms: ${*:2}" | sed "s|$URL|DB|"
}
for round in 1 2; do
  echo "round $round"
  t "$BIN" admin messages AQUSER.EMP_TOPIC --database "$URL"
  t "$BIN" admin messages AQUSER.EMP_TOPIC --database "$URL" --state PROCESSED
  t "$BIN" admin messages AQUSER.RAW_QUE --database "$URL"
  t "$BIN" admin messages AQUSER.RAW_QUE --database "$URL" --state WAIT
  t psql -Atq "$URL" -c 'SELECT count(*) FROM "AQUSER.AQ$EMP_TOPIC_TAB" WHERE queue = '"'AQUSER.EMP_TOPIC'"
  t psql -Atq "$URL" -c 'SELECT msg_state, count(*) FROM "AQUSER.AQ$RAW_TAB" GROUP BY 1'
done
