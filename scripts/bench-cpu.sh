#!/usr/bin/env bash
# One scenario against one build on a fresh PostgreSQL database, with the CPU it cost:
# the shares of the machine used by the servlet, by PostgreSQL's processes, idle, and the
# rest (mostly the load generator), from /proc over the run (see BENCHMARKS.md).
# Usage: [PREFILL=100000] [TOKIO_WORKER_THREADS=N] scripts/bench-cpu.sh BIN send|batch|receive [SECONDS]
# (receive first fills the queue with PREFILL messages: more than it can take in the time)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$1; scenario=$2; secs=${3:-8}
cargo build --release --bin aqgate-bench --locked >/dev/null
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
port=18472
url="http://127.0.0.1:$port/aqserv"
PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_cpu' \
  -c 'CREATE DATABASE aqgate_bench_cpu' >/dev/null
"$bin" serve --listen "127.0.0.1:$port" --database "$pg/aqgate_bench_cpu" --no-smtp >/tmp/aqgate-bench-cpu.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
ticks() { # servlet, PostgreSQL processes, machine total, machine idle+iowait (clock ticks)
  local a p t i
  a=$(awk '{print $14+$15}' "/proc/$pid/stat")
  p=$(for q in $(pgrep -u postgres); do awk '{print $14+$15}' "/proc/$q/stat" 2>/dev/null || true; done | paste -sd+ | bc)
  t=$(awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8}' /proc/stat)
  i=$(awk '/^cpu /{print $5+$6}' /proc/stat)
  echo "$a $p $t $i"
}
read -r a0 p0 t0 i0 < <(ticks)
target/release/aqgate-bench --url "$url" --scenario "$scenario" --seconds "$secs" --clients 4 --prefill "${PREFILL:-100000}"
read -r a1 p1 t1 i1 < <(ticks)
tot=$((t1 - t0))
sa=$(((a1 - a0) * 100 / tot)); sp=$(((p1 - p0) * 100 / tot)); si=$(((i1 - i0) * 100 / tot))
echo "share of the machine: servlet ${sa}%  postgres ${sp}%  idle ${si}%  other $((100 - sa - sp - si))%"
