#!/usr/bin/env bash
# A queue's life on PostgreSQL without autovacuum (see BENCHMARKS.md, "Dead rows"): on a
# fresh database whose tables have autovacuum off, ROUNDS rounds of a send run then a
# receive run (SECONDS each, 4 clients, 1 KiB) through one queue, once with aqgate's own
# vacuuming off (--vacuum-every 0) and once on (--vacuum-every 10): each round's send and
# receive rate, the messages passed through so far and the dead rows of `messages`.
#   scripts/bench-dead-rows.sh [BINARY] [ROUNDS] [SECONDS]   (default target/release/aqgate, 8, 15)
# AQGATE_BENCH_VACUUM_EVERY="0 10" are the --vacuum-every values run, in order.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/aqgate}
ROUNDS=${2:-8}
SECS=${3:-15}
cargo build --release --bin aqgate-bench --locked >/dev/null
scripts/ensure-postgres.sh >/dev/null
ADMIN_URL=${AQGATE_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
DB=aqgate_bench_dead_$$
PORT=18474
URL="${ADMIN_URL%/*}/$DB"
WORK=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; psql -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $DB"; rm -rf "$WORK"' EXIT
bench=(target/release/aqgate-bench --url "http://127.0.0.1:$PORT/aqserv" --clients 4 --seconds "$SECS")
rate() { sed -n 's/.* msgs\/s=\([0-9.]*\).*/\1/p' | tail -1; }

for every in ${AQGATE_BENCH_VACUUM_EVERY:-0 10}; do
  psql -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
  "$BIN" serve --listen "127.0.0.1:$PORT" --database "$URL" --no-smtp --no-notify --vacuum-every "$every" \
    >"$WORK/serve-$every.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 0.1; done
  psql -q "$URL" -c "ALTER TABLE messages SET (autovacuum_enabled = off)" -c "ALTER TABLE deliveries SET (autovacuum_enabled = off)"
  passed=0
  for round in $(seq 1 "$ROUNDS"); do
    send=$("${bench[@]}" --scenario send 2>&1 | rate)
    recv=$("${bench[@]}" --scenario receive --prefill 0 2>&1 | rate)
    passed=$(echo "$passed + $recv * $SECS" | bc)
    dead=$(psql -Atq "$URL" -c "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'messages'")
    live=$(psql -Atq "$URL" -c "SELECT count(*) FROM messages")
    printf 'vacuum-every=%-3s round %2d  send %8.0f msgs/s  receive %8.0f msgs/s  passed %9.0f  waiting %7d  dead rows %9d\n' \
      "$every" "$round" "$send" "$recv" "$passed" "$live" "$dead"
  done
  echo "vacuum-every=$every: tables vacuumed $(grep -c 'vacuumed' "$WORK/serve-$every.log" || true)"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
done
