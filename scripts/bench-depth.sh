#!/usr/bin/env bash
# A queue with a backlog against an empty one, aqgate and PGMQ on the same PostgreSQL in the
# same run (see BENCHMARKS.md, "A deep queue"). Per round, each on a fresh database:
# - aqgate: send (SECONDS, 4 clients, 1 KiB) into the empty queue, then receive (REMOVE +
#   commit) with 40,000 messages added first, then the listing (`admin messages` of the
#   queue, the first page of its AQ$ view, one message by id from the view); then the queue
#   is filled to DEPTH messages waiting, and receive, send and the listing again.
# - PGMQ (1 KiB JSON, pgbench, 4 clients, 2 threads, prepared): send, read + delete and pop
#   the same way, empty (40,000 added for the reads) and at DEPTH waiting.
# Rounds alternate which of the two goes first. Each line gives the rate at DEPTH as a
# fraction of the empty queue's (1.00: no slower).
# PASSED=N: instead of filling the queue to DEPTH, N messages pass through it (the queue
# empty again after), in chunks of about 200,000: aqgate's enqueued straight into its store
# in committed sets of 100 (`aqgate-bench --scenario store`) and taken one at a time by 64
# clients through the store's head-taking (`--scenario take`, the servlet's REMOVE +
# commit path below HTTP), with `serve` (and so its own vacuuming) running; PGMQ's with
# send_batch of 1,000 and read + delete of 1,000 at a time (4 clients). aqgate's receive is
# measured right after the passing and again once `serve` has vacuumed after it (its
# --vacuum-every, 5 s by default); PGMQ has no vacuuming of its own.
# Usage: scripts/bench-depth.sh PATH/TO/pgmq.sql [ROUNDS] [SECONDS] [DEPTH] [BINARY]
#   (PGMQ's pgmq-extension/sql/pgmq.sql, as for scripts/bench-pgmq.sh; defaults 2 8 1000000
#   target/release/aqgate)
set -euo pipefail
cd "$(dirname "$0")/.."
sql=${1:?usage: $0 PATH/TO/pgmq.sql [ROUNDS] [SECONDS] [DEPTH] [BINARY]}
rounds=${2:-2}; secs=${3:-8}; depth=${4:-1000000}; bin=${5:-target/release/aqgate}
passed=${PASSED:-0}; chunk=200000
cargo build --release --bin aqgate-bench --locked >/dev/null
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
port=18475
adb="$pg/aqgate_bench_depth"; pdb="$pg/pgmq_bench_depth"
dir=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
fresh() { PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1" >/dev/null; }
rate() { sed -n 's/.* msgs\/s=\([0-9.]*\).*/\1/p' | tail -1; }
ratio() { awk -v d="$2" -v e="$1" 'BEGIN { printf "%.2f", d / e }'; }
ms() { local s; s=$(date +%s%N); "$@" >/dev/null 2>&1; echo $(( ($(date +%s%N) - s) / 1000000 )); }

bench=(target/release/aqgate-bench --url "http://127.0.0.1:$port/aqserv" --clients 4 --seconds "$secs")
listing() { # prints: admin_ms view_page_ms view_by_id_ms
  local id
  id=$(psql -Atq "$adb" -c "SELECT encode(msgid, 'hex') FROM messages ORDER BY seq DESC LIMIT 1")
  echo "$(ms "$bin" admin messages AQUSER.RAW_QUE --database "$adb")" \
       "$(ms psql -Atq "$adb" -c 'SELECT msg_id, msg_state, enq_time FROM "AQUSER.AQ$RAW_TAB" LIMIT 100')" \
       "$(ms psql -Atq "$adb" -c "SELECT msg_state FROM \"AQUSER.AQ\$RAW_TAB\" WHERE msg_id = upper('$id')")"
}
aqgate_pass() { # PASSED messages through the queue, which holds $1 at the start
  local through=0 t0 taken store=(target/release/aqgate-bench --database "$adb")
  t0=$(date +%s)
  "${store[@]}" --scenario take --clients 64 --seconds 3600 >/dev/null
  while [ "$through" -lt "$passed" ]; do
    "${store[@]}" --scenario store --batch 100 --clients 4 --seconds 3 >/dev/null
    taken=$("${store[@]}" --scenario take --clients 64 --seconds 3600 | sed -n 's/.* requests=\([0-9]*\).*/\1/p')
    through=$((through + taken))
  done
  echo "aqgate: $((through + $1)) passed in $(( $(date +%s) - t0 )) s; dead rows of messages now" \
    "$(psql -Atq "$adb" -c "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'messages'")," \
    "vacuumed $(grep -c 'vacuumed' "$dir/serve.log" || true) times" >&2
}
aqgate_round() {
  fresh aqgate_bench_depth
  "$bin" serve --listen "127.0.0.1:$port" --database "$adb" --no-smtp --no-notify >"$dir/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
  local s0 r0 l0 s1 r1 l1 waiting
  s0=$("${bench[@]}" --scenario send 2>&1 | rate)
  r0=$("${bench[@]}" --scenario receive --prefill 40000 2>&1 | rate)
  read -r -a l0 <<<"$(listing)"
  waiting=$(psql -Atq "$adb" -c "SELECT count(*) FROM messages")
  if [ "$passed" -gt 0 ]; then
    aqgate_pass "$waiting"
    local vacuums; vacuums=$(grep -c 'vacuumed' "$dir/serve.log" || true)
    r1=$("${bench[@]}" --scenario receive --prefill 40000 2>&1 | rate)
    for _ in $(seq 1 120); do [ "$(grep -c 'vacuumed' "$dir/serve.log" || true)" -gt "$vacuums" ] && break; sleep 1; done
    echo "aqgate: receive right after $r1 msgs/s; dead rows of messages after serve's next vacuum" \
      "$(psql -Atq "$adb" -c "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'messages'")" >&2
    r1=$("${bench[@]}" --scenario receive --prefill 40000 2>&1 | rate)
  else
    # Filled to DEPTH (the receive scenario's prefill, in requests of 500), then received from.
    r1=$("${bench[@]}" --scenario receive --prefill $((depth - waiting)) 2>&1 | rate)
  fi
  s1=$("${bench[@]}" --scenario send 2>&1 | rate)
  read -r -a l1 <<<"$(listing)"
  waiting=$(psql -Atq "$adb" -c "SELECT count(*) FROM messages")
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  printf 'round %s aqgate  send %6.0f -> %6.0f (%s)  receive %6.0f -> %6.0f (%s)  waiting at the end %d\n' \
    "$1" "$s0" "$s1" "$(ratio "$s0" "$s1")" "$r0" "$r1" "$(ratio "$r0" "$r1")" "$waiting"
  printf 'round %s aqgate  admin messages %s -> %s ms  view page %s -> %s ms  view by id %s -> %s ms\n' \
    "$1" "${l0[0]}" "${l1[0]}" "${l0[1]}" "${l1[1]}" "${l0[2]}" "${l1[2]}"
}

msg="{\"data\": \"$(head -c 1000 /dev/zero | tr '\0' x)\"}"
echo "SELECT * FROM pgmq.send('bench', :msg::jsonb);" >"$dir/send.sql"
printf '%s\n' "SELECT msg_id AS mid FROM pgmq.read('bench', 30, 1) \\gset" \
  "SELECT pgmq.delete('bench', :mid::bigint);" >"$dir/read_delete.sql"
echo "SELECT * FROM pgmq.pop('bench');" >"$dir/pop.sql"
pgb() { pgbench -n -c 4 -j 2 -M prepared -T "$secs" -D msg="$msg" -f "$dir/$1.sql" "$pdb" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p'; }
fill() { # $1 messages more, in send_batch calls of 1,000
  psql "$pdb" -qc "SELECT count(*) FROM (SELECT pgmq.send_batch('bench', array_fill('$msg'::jsonb, ARRAY[1000])) FROM generate_series(1, $(( $1 / 1000 )))) s" >/dev/null
}
printf '%s\n' "SELECT pgmq.delete('bench', array(SELECT msg_id FROM pgmq.read('bench', 30, 1000)));" >"$dir/drain.sql"
pgmq_pass() { # PASSED messages through the queue, emptied first
  local through=0 t0 left
  t0=$(date +%s)
  while :; do
    left=$(psql -Atq "$pdb" -c "SELECT count(*) FROM pgmq.q_bench")
    [ "$left" = 0 ] && [ "$through" -ge "$passed" ] && break
    if [ "$left" = 0 ]; then fill "$chunk"; through=$((through + chunk)); left=$chunk; fi
    pgbench -n -c 4 -j 2 -M prepared -t $(( (left + 3999) / 4000 )) -f "$dir/drain.sql" "$pdb" >/dev/null 2>&1
  done
  echo "pgmq: $through passed in $(( $(date +%s) - t0 )) s; dead rows of q_bench now" \
    "$(psql -Atq "$pdb" -c "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'q_bench'")" >&2
}
pgmq_round() {
  fresh pgmq_bench_depth
  psql "$pdb" -q -v ON_ERROR_STOP=1 -f "$sql" >/dev/null
  psql "$pdb" -q -v ON_ERROR_STOP=1 -c "SELECT pgmq.create('bench')" >/dev/null
  local s0 rd0 p0 s1 rd1 p1 waiting
  s0=$(pgb send)
  fill 40000; rd0=$(pgb read_delete)
  fill 40000; p0=$(pgb pop)
  waiting=$(psql -Atq "$pdb" -c "SELECT count(*) FROM pgmq.q_bench")
  if [ "$passed" -gt 0 ]; then
    pgmq_pass
    fill 40000; rd1=$(pgb read_delete)
    fill 40000; p1=$(pgb pop); s1=$(pgb send)
  else
    fill $((depth - waiting))
    rd1=$(pgb read_delete); p1=$(pgb pop); s1=$(pgb send)
  fi
  printf 'round %s pgmq    send %6.0f -> %6.0f (%s)  read+delete %6.0f -> %6.0f (%s)  pop %6.0f -> %6.0f (%s)\n' \
    "$1" "$s0" "$s1" "$(ratio "$s0" "$s1")" "$rd0" "$rd1" "$(ratio "$rd0" "$rd1")" "$p0" "$p1" "$(ratio "$p0" "$p1")"
}

if [ "$passed" -gt 0 ]; then
  echo "$passed passed through, $secs s a run; rates in msgs/s, new -> after (after / new)"
else
  echo "depth $depth, $secs s a run; rates in msgs/s, empty -> deep (deep / empty)"
fi
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then aqgate_round "$r"; pgmq_round "$r"; else pgmq_round "$r"; aqgate_round "$r"; fi
done
