#!/usr/bin/env bash
# What synchronous replication costs aqgate: `aqgate-bench --scenario send` against the
# Patroni cluster of scripts/pg-cluster.sh (through HAProxy), with Patroni's
# synchronous_mode on and off in turn, each round on a fresh database (docs/ha-postgresql.md).
# Usage: scripts/bench-ha.sh ROUNDS SECONDS [AQGATE AQGATE_BENCH]
#   (the binaries default to target/release/, built here when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; secs=${2:-10}
bin=${3:-target/release/aqgate}; bench=${4:-target/release/aqgate-bench}
if [ ! -x "$bin" ] || [ ! -x "$bench" ]; then
  cargo build --release --locked --bin aqgate --bin aqgate-bench >/dev/null
fi
scripts/ensure-patroni.sh >/dev/null
dir=$(mktemp -d /tmp/aqgate-bench-ha-XXXXXX)
trap 'kill "${pid:-0}" 2>/dev/null || true; scripts/pg-cluster.sh stop "$dir" >/dev/null 2>&1; rm -rf "$dir"' EXIT
scripts/pg-cluster.sh start "$dir" 2>/dev/null
lb=postgres://postgres@127.0.0.1:${AQGATE_HA_LB:-25000}
port=18472
set_sync() { # on|off: synchronous_mode, then wait until PostgreSQL runs with it
  local want=false standby=''
  [ "$1" = on ] && want=true
  patronictl -c "$dir/node1.yml" edit-config --force -s "synchronous_mode=$want" >/dev/null
  for _ in $(seq 1 100); do
    standby=$(psql "$lb/postgres" -XAtqc 'show synchronous_standby_names')
    if { [ "$1" = on ] && [ -n "$standby" ]; } || { [ "$1" = off ] && [ -z "$standby" ]; }; then return; fi
    sleep 0.2
  done
  echo "bench-ha: synchronous_mode=$want not in effect" >&2; exit 1
}
for r in $(seq 1 "$rounds"); do
  for mode in on off; do
    set_sync "$mode"
    psql "$lb/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_ha' -c 'CREATE DATABASE aqgate_bench_ha' >/dev/null
    "$bin" serve --listen "127.0.0.1:$port" --database "$lb/aqgate_bench_ha" --no-smtp --no-notify >"$dir/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
    "$bench" --url "http://127.0.0.1:$port/aqserv" --scenario send --seconds "$secs" --clients 4 |
      sed "s|^|round=$r synchronous_mode=$mode |"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
