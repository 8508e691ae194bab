#!/usr/bin/env bash
# Buffered against persistent messages in one run (see BENCHMARKS.md, "Buffered
# messages"): each round starts a fresh aqgate on a fresh PostgreSQL database per delivery
# mode, odd rounds persistent first, even rounds buffered first, and drives the send and
# receive scenarios with the same load generator; then prints each figure's median.
# Usage: scripts/bench-buffered.sh [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; secs=${2:-8}
cargo build --release --locked --bin aqgate --bin aqgate-bench >/dev/null
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
port=18472
url="http://127.0.0.1:$port/aqserv"
out=$(mktemp)
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then modes="persistent buffered"; else modes="buffered persistent"; fi
  for mode in $modes; do
    flag=""; [ "$mode" = buffered ] && flag="--buffered"
    PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_buf' -c 'CREATE DATABASE aqgate_bench_buf' >/dev/null
    # Room for the receive scenario's prefill in memory: flow control and spilling off.
    target/release/aqgate serve --listen "127.0.0.1:$port" --database "$pg/aqgate_bench_buf" --no-smtp \
      --buffered-max-messages 1000000 --buffered-spill-bytes 4000000000 >/tmp/aqgate-bench-buf.log 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
    for s in send receive; do
      target/release/aqgate-bench --url "$url" --scenario "$s" --seconds "$secs" --clients 4 --prefill 40000 $flag \
        | sed "s|^|round=$r |" | tee -a "$out"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
echo "medians of $rounds rounds (msgs/s):"
for s in Send Receive; do
  for mode in persistent buffered; do
    med=$(grep "scenario=$s delivery=$mode " "$out" | sed 's/.*msgs\/s=\([0-9]*\).*/\1/' | sort -n \
      | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}')
    echo "$s $mode $med"
  done
done
rm -f "$out"
