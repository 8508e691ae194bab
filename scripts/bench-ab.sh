#!/usr/bin/env bash
# Compares aqgate builds back to back on PostgreSQL (see BENCHMARKS.md): each round runs
# every binary in turn on a fresh database, with the same load generator.
# Usage: scripts/bench-ab.sh "send batch receive" ROUNDS SECONDS BIN_A BIN_B [BIN ...]
#   e.g. cp target/release/aqgate /tmp/aqgate-old; (change, build); \
#        scripts/bench-ab.sh "send batch receive" 3 8 /tmp/aqgate-old target/release/aqgate
# The Messaging Gateway's jobs need brokers and a topology of their own: compare builds with
# `AQGATE_BIN=BIN scripts/bench-gateway.sh 1 2000`, one build a run, in the order B A A B.
set -euo pipefail
cd "$(dirname "$0")/.."
scenarios=$1; rounds=$2; secs=$3; shift 3
[ $# -ge 2 ] || { echo "usage: $0 SCENARIOS ROUNDS SECONDS BIN_A BIN_B [BIN ...]" >&2; exit 2; }
cargo build --release --bin aqgate-bench --locked >/dev/null
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
port=18471
url="http://127.0.0.1:$port/aqserv"
for r in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_ab' -c 'CREATE DATABASE aqgate_bench_ab' >/dev/null
    "$bin" serve --listen "127.0.0.1:$port" --database "$pg/aqgate_bench_ab" --no-smtp >/tmp/aqgate-bench-ab.log 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
    for s in $scenarios; do
      target/release/aqgate-bench --url "$url" --scenario "$s" --seconds "$secs" --clients 4 --prefill 40000 \
        | sed "s|^|round=$r bin=$bin |"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
