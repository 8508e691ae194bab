#!/usr/bin/env bash
# Propagation lag on PostgreSQL (see BENCHMARKS.md): single committed sends at RATE msgs/s
# (default 1000) into AQUSER.RAW_QUE, which a local job (preserve_message_id) moves to
# AQUSER.RAW_ARCHIVE. The bench is registered for notifications on the destination, so each
# message's lag is the time from its source commit's answer to its destination commit's
# notification. Each round also measures the same sends notified on the source itself (no
# propagation), the peer figure: lag minus that is what propagation adds. Order alternates.
# Usage: scripts/bench-propagation-lag.sh ROUNDS SECONDS [RATE]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=$1; secs=$2; rate=${3:-1000}
cargo build --release --bin aqgate --bin aqgate-bench --locked >/dev/null
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
db="$pg/aqgate_bench_lag"
port=18473
topo=$(mktemp --suffix=.toml)
trap 'rm -f "$topo"' EXIT
{ cat config/topology.toml; cat <<TOML

[[queues]]
name = "AQUSER.RAW_ARCHIVE"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "lag"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.RAW_ARCHIVE"
preserve_message_id = true
TOML
} > "$topo"
run() { # $1: propagated | direct
  PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_lag' -c 'CREATE DATABASE aqgate_bench_lag' >/dev/null
  target/release/aqgate serve --no-smtp --notify-allow 127.0.0.1 --listen "127.0.0.1:$port" --database "$db" --topology "$topo" >/tmp/aqgate-bench-lag.log 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
  local reg=()
  [ "$1" = propagated ] && reg=(--register-queue AQUSER.RAW_ARCHIVE)
  echo "$1 $(target/release/aqgate-bench --url "http://127.0.0.1:$port/aqserv" --scenario notify --rate "$rate" --seconds "$secs" --clients 4 "${reg[@]}")"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then run propagated; run direct; else run direct; run propagated; fi | sed "s/^/round=$r /"
done
