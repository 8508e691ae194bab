#!/usr/bin/env bash
# The web console at scale (see BENCHMARKS.md, "The web console"): on a fresh PostgreSQL
# database, the demo topology plus 9,980 queues (10,000 in all, as many as the console's sampler tracks; 50 messages each) and 500,000 messages in
# AQUSER.RAW_QUE (1,000,000 in all); then each page's render time (p50, p99, slowest) with
# the console's admin logged in with Basic, as `aqgate-bench --scenario pages` measures it;
# the server's CPU with 100 console tabs open (`--scenario tabs`) against none, under one
# steady sender; and the servlet's send rate with 10 tabs open against none, 4 rounds in
# both orders.
#   scripts/bench-console.sh [BINARY] [SECONDS]     (default target/release/aqgate, 20)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/aqgate}
SECS=${2:-20}
cargo build --release --bin aqgate-bench --locked >/dev/null
scripts/ensure-postgres.sh >/dev/null
ADMIN_URL=${AQGATE_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
DB=aqgate_bench_console_$$
PORT=18473
WORK=$(mktemp -d)
psql -q "$ADMIN_URL" -c "CREATE DATABASE $DB"
URL="${ADMIN_URL%/*}/$DB"
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; psql -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $DB"; rm -rf "$WORK"' EXIT

# The demo topology (scott is the console's admin) and 9,980 more queues (10,000 in all) in AQUSER.RAW_TAB.
cp config/topology.toml "$WORK/topology.toml"
for i in $(seq -w 1 9980); do
  printf '[[queues]]\nname = "AQUSER.BENCH_Q%s"\nqueue_table = "AQUSER.RAW_TAB"\n\n' "$i"
done >>"$WORK/topology.toml"
"$BIN" admin apply "$WORK/topology.toml" --database "$URL" >/dev/null
R=$(psql -Atq "$URL" -c "SELECT id FROM queues WHERE name = 'AQUSER.RAW_QUE'")
NOW=$(date +%s%6N)
psql -q "$URL" <<SQL
INSERT INTO messages (msgid, queue_id, corrid, priority, enq_time, payload, single, prio_key, enq_user_id)
SELECT decode(md5('r' || g), 'hex'), $R, 'R' || g, 1, $NOW - 10000000000 + g, '\x01', true, 1, 'SCOTT'
FROM generate_series(1, 500000) g;
INSERT INTO messages (msgid, queue_id, corrid, priority, enq_time, payload, single, prio_key, enq_user_id)
SELECT decode(md5('b' || q.id || '-' || g), 'hex'), q.id, 'B' || g, 1, $NOW - 10000000000 + g, '\x02', true, 1, 'SCOTT'
FROM queues q, generate_series(1, 50) g WHERE q.name LIKE 'AQUSER.BENCH\_Q%';
ANALYZE;
SQL
psql -Atq "$URL" -c "SELECT count(*) || ' messages in ' || count(DISTINCT queue_id) || ' queues' FROM messages"
one=$(psql -Atq "$URL" -c "SELECT encode(msgid, 'hex') FROM messages WHERE queue_id = $R ORDER BY seq LIMIT 1 OFFSET 250000" | tr a-f A-F)

# The tabs stand for many operators' browsers, all from 127.0.0.1: the per-address cap raised.
"$BIN" serve --no-topology --listen "127.0.0.1:$PORT" --database "$URL" --no-smtp --http-max-connections-per-ip 1000 >"$WORK/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 0.1; done
pages=${AQGATE_BENCH_PAGES:-/console/,/console/queues,/console/queues?sort=backlog,/console/queues?q=Q0999,/console/queues/AQUSER.RAW_QUE/messages,/console/queues/AQUSER.RAW_QUE/messages/$one,/console/agents}
bench=(target/release/aqgate-bench --url "http://127.0.0.1:$PORT/aqserv" --user scott --password tiger)
"${bench[@]}" --scenario pages --pages "$pages" --clients 2 --seconds "$SECS"

# The server's CPU seconds (user + system) so far.
cpu() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
for tabs in 0 100 0 100; do
  before=$(cpu)
  if [ "$tabs" -gt 0 ]; then "${bench[@]}" --scenario tabs --tabs "$tabs" --seconds "$SECS" & tabs_pid=$!; fi
  "${bench[@]}" --scenario send --clients 1 --seconds "$SECS" | sed "s|^|tabs=$tabs |"
  if [ "$tabs" -gt 0 ]; then wait "$tabs_pid"; fi
  echo "tabs=$tabs server CPU: $(awk -v a="$before" -v b="$(cpu)" -v s="$SECS" -v hz="$hz" 'BEGIN { printf "%.3f", (b - a) / hz / s }') s per s"
done
for round in 1 2 3 4; do
  order="0 10"; [ $((round % 2)) -eq 0 ] && order="10 0"
  for tabs in $order; do
    if [ "$tabs" -gt 0 ]; then
      "${bench[@]}" --scenario tabs --tabs "$tabs" --seconds $((SECS / 2 + 2)) | sed "s|^|round=$round |" &
      tabs_pid=$!
      sleep 1
    fi
    "${bench[@]}" --scenario send --clients 4 --seconds $((SECS / 2)) | sed "s|^|round=$round tabs=$tabs |"
    if [ "$tabs" -gt 0 ]; then wait "$tabs_pid"; fi
  done
done
