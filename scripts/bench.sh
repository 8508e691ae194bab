#!/usr/bin/env bash
# Benchmarks the servlet over HTTP on SQLite and on PostgreSQL (see BENCHMARKS.md).
# Usage: scripts/bench.sh [seconds] [clients]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
clients=${2:-4}
cargo build --release --bins --locked
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
port=18470
url="http://127.0.0.1:$port/aqserv"

run() {
  local db=$1
  target/release/aqgate serve --listen "127.0.0.1:$port" --database "$db" >/tmp/aqgate-bench-serve.log 2>&1 &
  local pid=$!
  trap 'kill $pid 2>/dev/null || true' RETURN
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
  for s in send batch receive; do
    target/release/aqgate-bench --url "$url" --scenario "$s" --seconds "$secs" --clients "$clients" --prefill 40000 | sed "s|^|$2 |"
  done
  kill $pid; wait $pid 2>/dev/null || true
}

rm -f /tmp/aqgate-bench.db*
run "sqlite:///tmp/aqgate-bench.db" sqlite
psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench' -c 'CREATE DATABASE aqgate_bench' >/dev/null
run "$pg/aqgate_bench" postgres
