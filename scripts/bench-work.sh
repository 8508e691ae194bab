#!/usr/bin/env bash
# The work one scenario costs per message on PostgreSQL, counted rather than timed, so that
# two builds can be compared on a noisy machine (see BENCHMARKS.md): SQL statements the
# servlet sent (sqlx's own statement log), PostgreSQL transactions, rows written, index and
# sequential scans, WAL bytes, and with CALLGRIND=1 the servlet's instructions (valgrind;
# the servlet then runs some ten times slower and logs no statements, so the statement
# count is 0 there).
# CLIENTS=1 makes the counts repeatable (no commits shared between requests); KEEP=1 keeps
# the log and the profile.
# Usage: [CALLGRIND=1] [CLIENTS=4] [KEEP=1] scripts/bench-work.sh BIN send|batch|receive [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$1; scenario=$2; secs=${3:-5}
cargo build --release --bin aqgate-bench --locked >/dev/null
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
db=aqgate_bench_work
port=18473
url="http://127.0.0.1:$port/aqserv"
log=$(mktemp /tmp/aqgate-bench-work-XXXXXX.log)
q() { psql "$pg/$db" -Atqc "$1"; }
PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS $db" \
  -c "CREATE DATABASE $db" >/dev/null

start() { # the servlet, logging every statement; under callgrind when asked
  local pre=() filter=warn,sqlx::query=debug
  if [ "${CALLGRIND:-}" = 1 ]; then
    filter=warn # formatting the statement log would be counted too
    pre=(valgrind --tool=callgrind --callgrind-out-file="$log.cg")
  fi
  AQGATE_LOG="${AQGATE_LOG:-$filter}" "${pre[@]}" "$bin" serve --listen "127.0.0.1:$port" \
    --database "$pg/$db" --no-smtp --no-notify >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && return 0; sleep 0.1; done
  echo "bench-work: the servlet did not become ready (log: $log)" >&2; exit 1
}
stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
trap stop EXIT

if [ "$scenario" = receive ]; then
  # The queue is filled by a first run of the servlet, not counted.
  AQGATE_LOG=warn start
  target/release/aqgate-bench --url "$url" --scenario batch --seconds "$secs" --clients 4 >/dev/null
  stop
fi
start
stats() { # transactions, rows written, scans, WAL position: read with the servlet stopped
  # (rows and scans of aqgate's own tables: autovacuum's work on the catalogs is left out;
  # the WAL position moves with it too)
  q "SELECT xact_commit + xact_rollback, (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)
       FROM pg_stat_user_tables) FROM pg_stat_database WHERE datname = '$db'" | tr '|' ' '
  q "SELECT coalesce(sum(coalesce(idx_scan, 0) + coalesce(seq_scan, 0)), 0) FROM pg_stat_user_tables"
  q "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"
}
before_lines=$(grep -c 'sqlx::query' "$log" || true)
read -r x0 w0 < <(stats | sed -n 1p); s0=$(stats | sed -n 2p); l0=$(stats | sed -n 3p)
[ "${CALLGRIND:-}" = 1 ] && callgrind_control -z "$pid" >/dev/null
out=$(target/release/aqgate-bench --url "$url" --scenario "$scenario" --seconds "$secs" --clients "${CLIENTS:-4}" --prefill 0)
[ "${CALLGRIND:-}" = 1 ] && callgrind_control -d "$pid" >/dev/null
echo "$out"
n=$(($(echo "$out" | grep -o 'requests=[0-9]*' | cut -d= -f2) * $(echo "$out" | grep -o 'batch=[0-9]*' | cut -d= -f2)))
sleep 0.5
stop
after_lines=$(grep -c 'sqlx::query' "$log" || true)
sleep 1 # the backends' statistics are flushed as they exit
read -r x1 w1 < <(stats | sed -n 1p); s1=$(stats | sed -n 2p); l1=$(stats | sed -n 3p)
per() { echo "scale=2; ($1) / $n" | bc; }
echo "per message ($n messages): statements $(per "$after_lines - $before_lines")  transactions $(per "$x1 - $x0")" \
  " rows written $(per "$w1 - $w0")  scans $(per "$s1 - $s0")  WAL bytes $(per "$l1 - $l0")"
if [ "${CALLGRIND:-}" = 1 ]; then
  # The whole process, and the two tasks a request's work runs in: its connection's
  # (parsing, the engine, the reply) and the commit coalescer's (sends); the rest is the
  # first login's password hash and the background tasks.
  incl() { callgrind_annotate --inclusive=yes --threshold=100 "$log.cg.1" 2>/dev/null |
    awk -v f="$1" 'index($0, f) { gsub(",", "", $1); n = $1; exit } END { print n + 0 }'; }
  echo "servlet instructions per message: all $(per "$(sed -n 's/^totals: //p' "$log.cg.1")")" \
    " connection tasks $(per "$(incl 'serve_connections::{{closure}}::{{closure}} ')")" \
    " commit coalescer $(per "$(incl 'Coalescer::start::{{closure}} ')")"
fi
[ -n "${KEEP:-}" ] || rm -f "$log" "$log.cg"*
