#!/usr/bin/env bash
# Local propagation against batch enqueue in the same run, on PostgreSQL (see BENCHMARKS.md).
# Each round, on a fresh database: the batch scenario enqueues 1 KiB RAW messages into
# AQUSER.RAW_QUE for SECONDS (its msgs/s is the batch enqueue rate), while a propagation job
# moves them to AQUSER.RAW_ARCHIVE; then the time until the job has moved all of them gives
# its rate (messages / time from the first enqueue to the last move). The end is found by
# one index probe of the source every 20 ms (an `admin queues` count of both queues would
# itself cost the database tens of milliseconds each time), and the destination's count is
# checked once at the end: every message moved, none twice.
# Usage: [AQGATE_BIN=target/release/aqgate] scripts/bench-propagation.sh ROUNDS SECONDS [BATCH_SIZE] [CONCURRENCY]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=$1; secs=$2; job_batch=${3:-30}; job_concurrency=${4:-1}
cargo build --release --bin aqgate --bin aqgate-bench --locked >/dev/null
bin=${AQGATE_BIN:-target/release/aqgate}
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
db="$pg/aqgate_bench_prop"
port=18472
topo=$(mktemp --suffix=.toml)
trap 'rm -f "$topo"' EXIT
{ cat config/topology.toml; cat <<TOML

[[queues]]
name = "AQUSER.RAW_ARCHIVE"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "bench"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.RAW_ARCHIVE"
batch_size = $job_batch
concurrency = $job_concurrency
TOML
} > "$topo"
depth() { "$bin" admin queues --database "$db" | awk -v q="$1" '$1 == q { print $NF }'; }
source_empty() {
  psql "$db" -Atqc "SELECT NOT EXISTS (SELECT 1 FROM messages m JOIN queues q ON q.id = m.queue_id
                                        WHERE q.name = 'AQUSER.RAW_QUE' AND m.single)"
}
for r in $(seq 1 "$rounds"); do
  PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_prop' -c 'CREATE DATABASE aqgate_bench_prop' >/dev/null
  "$bin" serve --no-smtp --no-notify --listen "127.0.0.1:$port" --database "$db" --topology "$topo" >/tmp/aqgate-bench-prop.log 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
  start=$(date +%s.%N)
  line=$(target/release/aqgate-bench --url "http://127.0.0.1:$port/aqserv" --scenario batch --seconds "$secs" --clients 4)
  sent=$(echo "$line" | sed -E 's/.*requests=([0-9]+).*/\1/'); sent=$((sent * 100))
  deadline=$((SECONDS + 600))
  until [ "$(source_empty)" = t ]; do
    if [ "$SECONDS" -gt "$deadline" ]; then echo "round $r: the job did not empty its source" >&2; kill "$pid"; exit 1; fi
    sleep 0.02
  done
  end=$(date +%s.%N)
  moved=$(depth AQUSER.RAW_ARCHIVE)
  if [ "$moved" != "$sent" ]; then
    echo "round $r: $sent sent, $moved in the destination" >&2; kill "$pid"; exit 1
  fi
  rate=$(echo "$sent / ($end - $start)" | bc)
  echo "round=$r $line propagated=$sent propagation_msgs/s=$rate"
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
