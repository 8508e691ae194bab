#!/usr/bin/env bash
# The Messaging Gateway's jobs against bare clients of the same crates doing the same
# confirmed work, in the same run, on PostgreSQL and the machine's brokers (see
# BENCHMARKS.md). Per broker and round, on a fresh database:
# - outbound: a bare consumer waits first (declaring the stream or queue), then aqgate
#   starts, and COUNT messages are enqueued to AQUSER.RAW_QUE (100 per request) as soon as
#   it is ready, while the job publishes them. Its rates: COUNT / (first enqueue → last
#   message at the consumer), and the steady one, first → last message at the consumer;
#   `outbound_start_ms`: the process started → the first message at the consumer;
#   `outbound_first_ms`: the first enqueue → the first message at the consumer.
#   Peers: `aqgate-bench --scenario broker-publish` in batches of 30, confirmations awaited
#   per batch (`peer_publish`), and pipelined, every confirmation awaited at the end
#   (`peer_pipelined`).
# - inbound: COUNT messages published by a bare publisher while the job enqueues them to
#   AQUSER.RAW_ARCHIVE; its rate is COUNT / (first publish → the last enqueued). Peer:
#   `aqgate-bench --scenario broker-consume` (each message acked) on COUNT prefilled ones.
# Usage: [JOB_BATCH=30] [JOB_IN_FLIGHT=N] [ENQUEUERS=1] [NO_BUILD=1] [AQGATE_BIN=target/release/aqgate] scripts/bench-gateway.sh ROUNDS COUNT [nats rabbitmq mqtt]
# (JOB_BATCH: the jobs' batch_size, 30 the default; JOB_IN_FLIGHT: the outbound job's
# batches_in_flight, its default when unset; ENQUEUERS: enqueue loops at once, COUNT a
# multiple of 100 × ENQUEUERS; NO_BUILD=1: run the binaries as built, e.g. built with
# other features)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=$1; count=$2; shift 2
bin=${AQGATE_BIN:-target/release/aqgate}
brokers=${*:-nats rabbitmq mqtt}
[ "${NO_BUILD:-}" = 1 ] || cargo build --release --bin aqgate --bin aqgate-bench --locked >/dev/null
scripts/ensure-postgres.sh >/dev/null
scripts/ensure-brokers.sh >/dev/null
pg=${AQGATE_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}
db="$pg/aqgate_bench_gw"
port=18473
url="http://127.0.0.1:$port/aqserv"
topo=$(mktemp --suffix=.toml)
batch=$(mktemp --suffix=.xml)
trap 'rm -f "$topo" "$batch"' EXIT
hex=$(head -c 1024 /dev/zero | tr '\0' 'Z' | od -An -v -tx1 | tr -d ' \n' | tr a-f A-F)
{
  printf '<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>AQUSER.RAW_QUE</destination></producer_options><message_set><message_count>100</message_count>'
  for i in $(seq 1 100); do printf '<message><message_number>%d</message_number><message_payload><raw>%s</raw></message_payload></message>' "$i" "$hex"; done
  printf '</message_set><AQXmlCommit/></AQXmlSend></Body></Envelope>'
} > "$batch"
bench() { target/release/aqgate-bench "$@"; }
field() { sed -E "s|.*$1=([0-9.]+).*|\1|"; }
depth() { "$bin" admin queues --database "$db" | awk -v q="$1" '$1 == q { print $NF }'; }
for r in $(seq 1 "$rounds"); do
  for b in $brokers; do
    tag="b$r$(date +%s%N | tail -c 7)"
    case $b in
      nats) link="url = \"nats://127.0.0.1:4222\""; burl=nats://127.0.0.1:4222
            out="native_name = \"gwb.$tag.out\"
stream = \"GWB_${tag}_OUT\"
create = true"; inq="native_name = \"gwb.$tag.in\"
stream = \"GWB_${tag}_IN\"
create = true"; tout="gwb.$tag.out"; tin="gwb.$tag.in"; sout="GWB_${tag}_OUT"; sin="GWB_${tag}_IN";;
      rabbitmq) link="url = \"amqp://127.0.0.1:5672/%2f\"
username = \"guest\"
password_env = \"GWB_PASSWORD\""; burl=amqp://guest:guest@127.0.0.1:5672/%2f
            out="native_name = \"gwb.$tag.out\"
create = true"; inq="native_name = \"gwb.$tag.in\"
create = true"; tout="gwb.$tag.out"; tin="gwb.$tag.in"; sout=-; sin=-;;
      mqtt) link="url = \"mqtt://127.0.0.1:1883\""; burl=mqtt://127.0.0.1:1883
            out="native_name = \"gwb/$tag/out\""; inq="native_name = \"gwb/$tag/in\""
            tout="gwb/$tag/out"; tin="gwb/$tag/in"; sout=-; sin=-;;
    esac
    { cat config/topology.toml; cat <<TOML

[[queues]]
name = "AQUSER.RAW_ARCHIVE"
queue_table = "AQUSER.RAW_TAB"

[[gateway.links]]
name = "l"
kind = "$b"
$link

[[gateway.foreign_queues]]
name = "out"
link = "l"
$out

[[gateway.foreign_queues]]
name = "in"
link = "l"
$inq

[[gateway.jobs]]
name = "out_$tag"
source = "AQUSER.RAW_QUE"
destination = "out@l"
batch_size = ${JOB_BATCH:-30}
${JOB_IN_FLIGHT:+batches_in_flight = $JOB_IN_FLIGHT}

[[gateway.jobs]]
name = "in_$tag"
source = "in@l"
destination = "AQUSER.RAW_ARCHIVE"
batch_size = ${JOB_BATCH:-30}
TOML
    } > "$topo"
    PGOPTIONS='-c client_min_messages=warning' psql "$pg/postgres" -qc 'DROP DATABASE IF EXISTS aqgate_bench_gw' -c 'CREATE DATABASE aqgate_bench_gw' >/dev/null
    # Outbound: a bare consumer counts what the job publishes.
    bench --scenario broker-consume --broker "$b" --broker-url "$burl" --target "$tout" --stream="$sout" --count "$count" > /tmp/gwb-consume.txt &
    cpid=$!
    sleep 1
    started=$(date +%s.%N)
    GWB_PASSWORD=guest "$bin" serve --no-smtp --no-notify --listen "127.0.0.1:$port" --database "$db" --topology "$topo" >/tmp/aqgate-bench-gw.log 2>&1 &
    pid=$!
    for _ in $(seq 1 200); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.02; done
    t0=$(date +%s.%N)
    # ENQUEUERS loops at once: more than one enqueues faster than a job moves, so the job
    # works from a backlog (one alone may be what sets the job's rate).
    enq=${ENQUEUERS:-1}; epids=()
    for e in $(seq 1 "$enq"); do
      for _ in $(seq 1 $((count / 100 / enq))); do
        if curl -sf -u scott:tiger -H 'Content-Type: text/xml' --data-binary @"$batch" "$url" | grep -q Fault; then
          echo "bench-gateway: the enqueue was refused" >&2; exit 1
        fi
      done &
      epids+=($!)
    done
    for p in "${epids[@]}"; do wait "$p"; done   # each loop's status: a refused enqueue stops the run
    wait "$cpid"
    last=$(field last_at < /tmp/gwb-consume.txt)
    job_out=$(echo "$count / ($last - $t0)" | bc)
    steady_out=$(field 'msgs/s' < /tmp/gwb-consume.txt)
    first=$(field first_at < /tmp/gwb-consume.txt)
    start_ms=$(echo "($first - $started) * 1000 / 1" | bc)
    first_ms=$(echo "($first - $t0) * 1000 / 1" | bc)
    # The inbound job's subscription (MQTT: its session) is made by now.
    while [ "$(echo "$(date +%s.%N) - $started < 3" | bc)" = 1 ]; do sleep 0.1; done
    # Inbound: the job enqueues what a bare publisher sends.
    t0=$(date +%s.%N)
    bench --scenario broker-publish --broker "$b" --broker-url "$burl" --target "$tin" --stream="$sin" --count "$count" --batch 30 >/dev/null
    while [ "$(depth AQUSER.RAW_ARCHIVE)" -lt "$count" ]; do sleep 0.05; done
    job_in=$(echo "$count / ($(date +%s.%N) - $t0)" | bc)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    # The peers: a bare publisher, then a bare consumer of what another bare publisher sent.
    peer_out=$(bench --scenario broker-publish --broker "$b" --broker-url "$burl" --target "$tout.peer" --stream="${sout}_P" --count "$count" --batch 30 | field 'msgs/s')
    peer_pipe=$(bench --scenario broker-publish --broker "$b" --broker-url "$burl" --target "$tout.pipe" --stream="${sout}_Q" --count "$count" --batch "$count" | field 'msgs/s')
    if [ "$b" = mqtt ]; then
      bench --scenario broker-consume --broker "$b" --broker-url "$burl" --target "$tin.peer" --count "$count" > /tmp/gwb-peer.txt &
      cpid=$!; sleep 1
      bench --scenario broker-publish --broker "$b" --broker-url "$burl" --target "$tin.peer" --count "$count" --batch 30 >/dev/null
      wait "$cpid"; peer_in=$(field 'msgs/s' < /tmp/gwb-peer.txt)
    else
      bench --scenario broker-publish --broker "$b" --broker-url "$burl" --target "$tin.peer" --stream="${sin}_P" --count "$count" --batch 30 >/dev/null
      peer_in=$(bench --scenario broker-consume --broker "$b" --broker-url "$burl" --target "$tin.peer" --stream="${sin}_P" --count "$count" | field 'msgs/s')
    fi
    echo "round=$r broker=$b outbound_job=$job_out outbound_steady=$steady_out outbound_start_ms=$start_ms outbound_first_ms=$first_ms peer_publish=$peer_out peer_pipelined=$peer_pipe inbound_job=$job_in peer_consume=$peer_in"
  done
done
