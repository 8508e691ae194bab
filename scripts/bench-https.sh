#!/usr/bin/env bash
# HTTPS against plain HTTP in the same run, on PostgreSQL (see BENCHMARKS.md): each round
# starts one aqgate on a fresh database with HTTPS (the demo certificate, certs/gateway-tls.pem)
# on one port and plain HTTP on another, and runs each scenario over both, the order
# alternating from round to round. The load generator speaks HTTP/1.1 keep-alive on both
# (over TLS 1.3 with the ring provider), one connection per client.
# Usage: scripts/bench-https.sh "send batch receive" ROUNDS SECONDS [BIN]
set -euo pipefail
cd "$(dirname "$0")/.."
scenarios=$1; rounds=$2; secs=$3; bin=${4:-target/release/aqgate}
cargo build --release --bin aqgate --bin aqgate-bench --locked >/dev/null
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
https_port=18443; http_port=18471
for r in $(seq 1 "$rounds"); do
  PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_tls' -c 'CREATE DATABASE aqgate_bench_tls' >/dev/null
  "$bin" serve --no-smtp --no-notify --database "$pg/aqgate_bench_tls" \
    --listen "127.0.0.1:$https_port" --tls-cert certs/gateway-tls.pem --tls-key certs/gateway-tls.key.pem \
    --plain-listen "127.0.0.1:$http_port" >/tmp/aqgate-bench-https.log 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$http_port/readyz" >/dev/null && break; sleep 0.1; done
  if [ $((r % 2)) -eq 1 ]; then order="http https"; else order="https http"; fi
  for s in $scenarios; do
    for t in $order; do
      if [ "$t" = https ]; then url="https://localhost:$https_port/aqserv"; else url="http://127.0.0.1:$http_port/aqserv"; fi
      target/release/aqgate-bench --url "$url" --cacert certs/ca.pem --scenario "$s" --seconds "$secs" \
        --clients 4 --prefill 40000 | sed "s|^|round=$r transport=$t |"
    done
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
