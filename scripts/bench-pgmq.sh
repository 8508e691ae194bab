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
run() { # name, msgs per transaction
  local tps
  tps=$(pgbench -n -c 4 -j 2 -M prepared -T "$secs" -D msg="$msg" -D batch="$batch" -f "$dir/$1.sql" "$db" 2>&1 |
    sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  printf 'pgmq %-12s %8.0f msgs/s\n' "$1" "$(echo "$tps * $2" | bc -l)"
}
run send 1
run batch 100
# As in aqgate-bench, the receive scenarios add 40,000 messages to what the send runs left.
psql "$db" -qc "SELECT count(*) FROM (SELECT pgmq.send_batch('bench', array_fill('$msg'::jsonb, ARRAY[1000])) FROM generate_series(1, 40)) s" >/dev/null
run read_delete 1
run pop 1
