#!/usr/bin/env bash
# Compares aqgate builds back to back on PostgreSQL (see BENCHMARKS.md): each round runs
# every binary in turn on a fresh database, with the same load generator.
# Usage: scripts/bench-ab.sh "send batch receive" ROUNDS SECONDS BIN_A BIN_B [BIN ...]
#   e.g. cp target/release/aqgate /tmp/aqgate-old; (change, build); \
#        scripts/bench-ab.sh "send batch receive" 3 8 /tmp/aqgate-old target/release/aqgate
# Scenarios: the HTTP ones of aqgate-bench (send, batch, transact, receive), and
# gateway-nats, gateway-rabbitmq, gateway-mqtt: a Messaging Gateway outbound and inbound job
# pair on that broker (`scripts/bench-gateway.sh 1 COUNT BROKER` with the binary, COUNT from
# AQGATE_BENCH_GATEWAY_COUNT, default 4000; SECONDS does not apply), e.g.
#        scripts/bench-ab.sh "gateway-rabbitmq gateway-mqtt" 2 0 /tmp/aqgate-old target/release/aqgate
set -euo pipefail
cd "$(dirname "$0")/.."
scenarios=$1; rounds=$2; secs=$3; shift 3
[ $# -ge 2 ] || { echo "usage: $0 SCENARIOS ROUNDS SECONDS BIN_A BIN_B [BIN ...]" >&2; exit 2; }
cargo build --release --bin aqgate-bench --locked >/dev/null
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
port=18471
url="http://127.0.0.1:$port/aqserv"
http=; gateway=
for s in $scenarios; do
  case $s in
    gateway-nats|gateway-rabbitmq|gateway-mqtt) gateway="$gateway ${s#gateway-}";;
    send|batch|transact|receive) http="$http $s";;
    *) echo "bench-ab: unknown scenario $s" >&2; exit 2;;
  esac
done
bins=("$@")
for r in $(seq 1 "$rounds"); do
  # Rounds alternate the order of the binaries: A B, then B A.
  order=("${bins[@]}")
  if [ $((r % 2)) = 0 ]; then mapfile -t order < <(printf '%s\n' "${bins[@]}" | tac); fi
  for bin in "${order[@]}"; do
    for b in $gateway; do
      AQGATE_BIN="$bin" scripts/bench-gateway.sh 1 "${AQGATE_BENCH_GATEWAY_COUNT:-4000}" "$b" \
        | sed "s|^round=1 |round=$r bin=$bin |"
    done
    [ -n "$http" ] || continue
    PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_ab' -c 'CREATE DATABASE aqgate_bench_ab' >/dev/null
    "$bin" serve --listen "127.0.0.1:$port" --database "$pg/aqgate_bench_ab" --no-smtp >/tmp/aqgate-bench-ab.log 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
    for s in $http; do
      target/release/aqgate-bench --url "$url" --scenario "$s" --seconds "$secs" --clients 4 --prefill 40000 \
        | sed "s|^|round=$r bin=$bin |"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
