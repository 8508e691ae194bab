#!/usr/bin/env bash
# The SMTP filter's benchmark (BENCHMARKS.md): signed mails through aqgate (SMTP → verify →
# spool → 250, replies relayed to a sink in the bench) on SQLite and PostgreSQL, side by side
# with a private Postfix accepting the same request, unsigned, into its queue (smtp-source).
# Usage: scripts/bench-smtp.sh [mails] [clients] [paced rate] [rounds]
# Each backend runs twice: as fast as it takes mail (throughput, end of DATA → 250), then
# paced at a rate the forwarding worker keeps up with (end of DATA → reply received).
# With rounds > 0 it instead alternates Postfix and aqgate on PostgreSQL (unpaced) that
# many times, in both orders, each from a clean start, and prints every round's ratio and
# both medians: the machine's speed drifts, so only rounds run back to back compare.
set -euo pipefail
cd "$(dirname "$0")/.."
mails=${1:-8000}
clients=${2:-4}
rate=${3:-200}
rounds=${4:-0}
cargo build --release --bins --locked
scripts/ensure-tools.sh >/dev/null
scripts/ensure-postgres.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
work=$(mktemp -d /tmp/aqgate-bench-smtp.XXXXXX)
chmod 755 "$work"   # Postfix (user postfix) must reach its data directory inside
idap=examples/04-publish-and-commit.xml

# --- Postfix + smtp-source: the same IDAP request in an unsigned text/xml mail ---------------
{
  printf 'From: scott@example.com\r\nTo: scott@example.com\r\nSubject: AQ request\r\n'
  printf 'MIME-Version: 1.0\r\nContent-Type: text/xml; charset=utf-8\r\n\r\n'
  sed 's/$/\r/' "$idap"
} > "$work/unsigned.eml"
postfix_run() {
  scripts/postfix.sh start "$work/postfix" >/dev/null
  local port start end
  port=$(cat "$work/postfix/smtp_port")
  start=$(date +%s.%N)
  smtp-source -d -s "$clients" -m "$mails" -F "$work/unsigned.eml" -f scott@example.com -t scott@example.com "127.0.0.1:$port"
  end=$(date +%s.%N)
  echo "postfix smtp-source: $mails mails, $clients sessions, $(wc -c < "$work/unsigned.eml") bytes each:" \
       "$(awk -v n="$mails" -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", n / (b - a) }') mails/s accepted into the queue"
  scripts/postfix.sh stop "$work/postfix" >/dev/null
  rm -rf "$work/postfix"
}
trap 'scripts/postfix.sh stop "$work/postfix" >/dev/null 2>&1 || true' EXIT

# --- aqgate -------------------------------------------------------------------------------
start_serve() {
  target/release/aqgate serve --database "$1" --listen 127.0.0.1:18470 --smtp-listen 127.0.0.1:18525 \
      --mail-relay smtp://127.0.0.1:18526 >"$work/serve-$2.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do curl -sf http://127.0.0.1:18470/readyz >/dev/null && break; sleep 0.1; done
}
bench() {
  target/release/aqgate-bench --scenario smtp --smtp 127.0.0.1:18525 --idap "$idap" \
      --sign-cert certs/scott.pem --sign-key certs/scott.key.pem --clients "$clients" \
      --reply-sink 127.0.0.1:18526 "$@" 2>/dev/null
}
fresh_pg() {
  psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_smtp' -c 'CREATE DATABASE aqgate_bench_smtp' >/dev/null
  echo "$pg/aqgate_bench_smtp"
}
# Every run starts clean: Postfix from a new instance (empty queue and mailboxes), aqgate on
# a new database, and the writes of the run before flushed first (`sync`, then a pause), so
# neither pays for what the other left behind.
clean() { sync; sleep 2; }
aqgate_run() {
  start_serve "$(fresh_pg)" "postgres-$1"
  bench --mails "$mails" --seconds 120 | sed "s|^|aqgate postgres round $1 |"
  kill $pid; wait $pid 2>/dev/null || true
}
if [ "$rounds" -gt 0 ]; then
  # Odd rounds run Postfix first, even ones aqgate first: a drift of the machine within a
  # round falls on each side alike.
  for i in $(seq 1 "$rounds"); do
    if [ $((i % 2)) = 1 ]; then
      clean; postfix_run | sed "s|^|round $i |" | tee -a "$work/rounds"
      clean; aqgate_run "$i" | tee -a "$work/rounds"
    else
      clean; aqgate_run "$i" | tee -a "$work/rounds"
      clean; postfix_run | sed "s|^|round $i |" | tee -a "$work/rounds"
    fi
    p=$(sed -n "s/^round $i postfix.*: \([0-9]*\) mails\/s accepted.*/\1/p" "$work/rounds")
    a=$(sed -n "s/^aqgate postgres round $i .*mails\/s=\([0-9]*\).*/\1/p" "$work/rounds")
    echo "round $i: aqgate $a / postfix $p = $(awk -v a="$a" -v p="$p" 'BEGIN { printf "%.2f", a / p }')"
  done
  median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  pm=$(sed -n 's/.*: \([0-9]*\) mails\/s accepted.*/\1/p' "$work/rounds" | median)
  am=$(sed -n 's/.*mails\/s=\([0-9]*\).*/\1/p' "$work/rounds" | median)
  echo "median of $rounds rounds: postfix $pm aqgate-postgres $am mails/s;" \
       "ratio $(awk -v a="$am" -v p="$pm" 'BEGIN { printf "%.2f", a / p }')"
  rm -rf "$work"
  exit 0
fi
postfix_run
# Throughput: as fast as aqgate takes them. Then, on a fresh server (no backlog), paced.
start_serve "sqlite://$work/aq1.db" sqlite
bench --mails "$mails" --seconds 60 | sed "s|^|aqgate sqlite unpaced |"
kill $pid; wait $pid 2>/dev/null || true
start_serve "sqlite://$work/aq2.db" sqlite-paced
bench --mails $((rate * 15)) --seconds 15 --rate "$rate" | sed "s|^|aqgate sqlite $rate/s |"
kill $pid; wait $pid 2>/dev/null || true
start_serve "$(fresh_pg)" postgres
bench --mails "$mails" --seconds 60 | sed "s|^|aqgate postgres unpaced |"
kill $pid; wait $pid 2>/dev/null || true
start_serve "$(fresh_pg)" postgres-paced
bench --mails $((rate * 15)) --seconds 15 --rate "$rate" | sed "s|^|aqgate postgres $rate/s |"
kill $pid; wait $pid 2>/dev/null || true
rm -rf "$work"
