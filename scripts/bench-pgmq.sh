#!/usr/bin/env bash
# PGMQ on this machine, the yardstick of the throughput targets (see BENCHMARKS.md): installs
# PGMQ's plain SQL (pgmq-extension/sql/pgmq.sql from tembo-io/pgmq; not part of this
# repository, pass its path) into a scratch database and drives it with pgbench, a C
# client: 4 clients, 2 threads, prepared statements, 1 KiB JSON messages.
# Usage: scripts/bench-pgmq.sh PATH/TO/pgmq.sql [SECONDS]
#   e.g. git -C pgmq show HEAD:pgmq-extension/sql/pgmq.sql > /tmp/pgmq.sql
#        scripts/bench-pgmq.sh /tmp/pgmq.sql 10
set -euo pipefail
cd "$(dirname "$0")/.."
sql=${1:?usage: $0 PATH/TO/pgmq.sql [SECONDS]}
secs=${2:-10}
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
db="$pg/pgmq_bench"
scripts/ensure-postgres.sh >/dev/null
psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS pgmq_bench' -c 'CREATE DATABASE pgmq_bench' >/dev/null
psql "$db" -q -v ON_ERROR_STOP=1 -f "$sql" >/dev/null
psql "$db" -q -v ON_ERROR_STOP=1 -c "SELECT pgmq.create('bench')" >/dev/null
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
msg="{\"data\": \"$(head -c 1000 /dev/zero | tr '\0' x)\"}"
batch=$(python3 -c "import json,sys; m=sys.argv[1]; print('{' + ','.join([json.dumps(m)]*100) + '}')" "$msg")
echo "SELECT * FROM pgmq.send('bench', :msg::jsonb);" >"$dir/send.sql"
echo "SELECT * FROM pgmq.send_batch('bench', :batch::jsonb[]);" >"$dir/batch.sql"
printf '%s\n' "SELECT msg_id AS mid FROM pgmq.read('bench', 30, 1) \\gset" \
  "SELECT pgmq.delete('bench', :mid::bigint);" >"$dir/read_delete.sql"
echo "SELECT * FROM pgmq.pop('bench');" >"$dir/pop.sql"
# CPU ticks of every PostgreSQL process so far: the live ones, and the exited ones (pgbench's
# backends) through the postmaster's reaped children. Local servers only.
pg_ticks() {
  local pm t p
  pm=$(pgrep -o -x postgres) || { echo 0; return; }
  t=$(awk '{ print $16 + $17 }' "/proc/$pm/stat")
  for p in $(pgrep -x postgres); do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0))); done
  echo "$t"
}
hz=$(getconf CLK_TCK)
run() { # name, msgs per transaction
  local out tps t0 t1
  t0=$(pg_ticks)
  out=$(pgbench -n -c 4 -j 2 -M prepared -T "$secs" -D msg="$msg" -D batch="$batch" -f "$dir/$1.sql" "$db" 2>&1)
  t1=$(pg_ticks)
  tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  # PostgreSQL's CPU per message over the run (the run lasts $secs s at the rate given).
  printf 'pgmq %-12s %8.0f msgs/s  postgres %5.1f us/msg\n' "$1" "$(echo "$tps * $2" | bc -l)" \
    "$(echo "($t1 - $t0) * 1000000 / $hz / ($tps * $2 * $secs)" | bc -l)"
}
run send 1
run batch 100
# As in aqgate-bench, the receive scenarios add 40,000 messages to what the send runs left.
psql "$db" -qc "SELECT count(*) FROM (SELECT pgmq.send_batch('bench', array_fill('$msg'::jsonb, ARRAY[1000])) FROM generate_series(1, 40)) s" >/dev/null
run read_delete 1
run pop 1
