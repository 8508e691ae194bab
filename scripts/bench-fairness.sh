#!/usr/bin/env bash
# The fairness benchmark (BENCHMARKS.md, "Fairness under attack"): four honest agents send
# and receive small RAW messages at a steady rate, first alone, then while a fifth client
# runs each attack in turn; prints per phase the honest p50/p99/max, errors and p99 against
# the quiet phase, each attack's outcome, and the ledger of acknowledged sends. Exits
# non-zero if an acknowledged message was lost or delivered twice.
# Usage: scripts/bench-fairness.sh [--database postgres] [--debug] [aqgate-bench flags…]
#   e.g. scripts/bench-fairness.sh --quiet-seconds 10 --attack-seconds 10 --attacks a,f
# Defaults: 60 s quiet, then attacks a to i of 60 s each (+5 s settling): about 11 minutes.
# The server runs with a soft descriptor limit of 1024 (FAIR_SERVE_NOFILE), as on a
# default Linux login; the load generator raises its own.
set -euo pipefail
cd "$(dirname "$0")/.."
backend=sqlite profile=release
while [ $# -gt 0 ]; do
  case $1 in
    --database) backend=$2; shift 2 ;;
    --debug) profile=debug; shift ;;
    *) break ;;
  esac
done
features=(--no-default-features --features saml)
if [ "$profile" = release ]; then
  cargo build --release --bins --locked "${features[@]}"
else
  cargo build --bins --locked "${features[@]}"
fi
bin=target/$profile
port=${FAIR_PORT:-18480}
smtp_port=${FAIR_SMTP_PORT:-18525}
work=$(mktemp -d /tmp/aqgate-bench-fair.XXXXXX)
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
case $backend in
  sqlite) db="sqlite://$work/fair.db" ;;
  postgres)
    scripts/ensure-postgres.sh >/dev/null
    PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_fair' \
      -c 'CREATE DATABASE aqgate_bench_fair' >/dev/null
    db="$pg/aqgate_bench_fair" ;;
  *) echo "--database sqlite|postgres" >&2; exit 2 ;;
esac

# The demo's RAW queue and agents scott and john, three more honest agents, two more
# attackers (one for the session flood, one whose password the flood gets wrong), a
# queue for the attacks' own messages and a multi-consumer RAW queue for recipient lists.
# DEMO PASSWORDS.
cat > "$work/topology.toml" <<'EOF'
[[queue_tables]]
name = "AQUSER.RAW_TAB"
payload_type = "RAW"
sort_list = "priority,enq_time"

[[queues]]
name = "AQUSER.RAW_QUE"
queue_table = "AQUSER.RAW_TAB"

[[queue_tables]]
name = "AQUSER.FAIR_ATTACK_TAB"
payload_type = "RAW"

[[queues]]
name = "AQUSER.FAIR_ATTACK_QUE"
queue_table = "AQUSER.FAIR_ATTACK_TAB"

[[queue_tables]]
name = "AQUSER.FAIR_TOPIC_TAB"
payload_type = "RAW"
multiple_consumers = true

[[queues]]
name = "AQUSER.FAIR_TOPIC"
queue_table = "AQUSER.FAIR_TOPIC_TAB"

[[agents]]
name = "scott"
password = "tiger"
protocols = ["http", "smtp"]
db_users = ["AQUSER"]

[[agents]]
name = "alice"
password = "fair-demo"
protocols = ["http"]
db_users = ["AQUSER"]

[[agents]]
name = "bob"
password = "fair-demo"
protocols = ["http"]
db_users = ["AQUSER"]

[[agents]]
name = "carol"
password = "fair-demo"
protocols = ["http"]
db_users = ["AQUSER"]

[[agents]]
name = "john"
password = "welcome"
protocols = ["http", "smtp"]
db_users = ["AQUSER"]

[[agents]]
name = "trudy"
password = "fair-demo"
protocols = ["http"]
db_users = ["AQUSER"]

[[agents]]
name = "mallory"
password = "fair-demo"
protocols = ["http"]
db_users = ["AQUSER"]

[[agents]]
name = "aqgateway"
password = "gateway-demo"
protocols = ["http"]
gateway = true
EOF

(
  ulimit -Sn "${FAIR_SERVE_NOFILE:-1024}"
  exec "$bin/aqgate" serve --listen "127.0.0.1:$port" --database "$db" --topology "$work/topology.toml" \
    --smtp-listen "127.0.0.1:$smtp_port" --mail-outbox "$work/outbox"
) >"$work/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || { echo "aqgate did not start:" >&2; cat "$work/serve.log" >&2; exit 1; }
rss() { awk '/VmHWM/ { printf "%d MB", $2 / 1024 }' "/proc/$pid/status" 2>/dev/null; }

echo "fairness: $backend, $profile build, serve log $work/serve.log"
status=0
(ulimit -Sn "$(ulimit -Hn)"; exec "$bin/aqgate-bench" --scenario fairness --url "http://127.0.0.1:$port/aqserv" \
  --smtp "127.0.0.1:$smtp_port" "$@") || status=$?
echo "aqgate peak RSS: $(rss); still running: $(kill -0 $pid 2>/dev/null && echo yes || echo NO)"
exit $status
