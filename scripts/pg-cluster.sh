#!/usr/bin/env bash
# A private PostgreSQL failover cluster on this machine, as deploy/patroni/ describes it:
# etcd, two Patroni-managed PostgreSQL 15 nodes (synchronous replication) and HAProxy routing
# to the primary. Everything lives in DIR (data, configuration, logs, pid files); nothing
# touches the machine's own PostgreSQL cluster. Test settings: trust on 127.0.0.1.
#
#   scripts/pg-cluster.sh start DIR    starts it, waits until a leader exists, its replica
#                                      streams synchronously and HAProxy routes to the leader
#   scripts/pg-cluster.sh stop DIR     stops everything `start` started (pid files in DIR)
#   scripts/pg-cluster.sh status DIR   `patronictl list`, and where HAProxy routes
#
# Ports (environment, with defaults): AQGATE_HA_ETCD (23790; its peer port 23800),
# AQGATE_HA_PG1/2 (25432, 25433), AQGATE_HA_API1/2 (28008, 28009), AQGATE_HA_LB (25000).
# Clients connect to postgres://postgres@127.0.0.1:$AQGATE_HA_LB/postgres. Patroni's
# configuration for patronictl: DIR/patroni.yml with DIR/nodeN.env (or
# `patronictl -c DIR/node1.yml`). PostgreSQL refuses to run as root: when run as root, DIR
# is given to the postgres user and etcd and Patroni run as postgres. Needs
# scripts/ensure-patroni.sh (and PostgreSQL 15 in /usr/lib/postgresql/15/bin).
set -euo pipefail

usage() { echo "usage: $0 start|stop|status DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$(realpath -m "$2")
root=$(cd "$(dirname "$0")/.." && pwd)

etcd_port=${AQGATE_HA_ETCD:-23790}
etcd_peer=$((etcd_port + 10))
pg=("${AQGATE_HA_PG1:-25432}" "${AQGATE_HA_PG2:-25433}")
api=("${AQGATE_HA_API1:-28008}" "${AQGATE_HA_API2:-28009}")
lb=${AQGATE_HA_LB:-25000}

say() { echo "pg-cluster: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

# Runs "$@" as postgres when we are root (execs, so that $! is the program itself).
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    exec setpriv --reuid=postgres --regid=postgres --init-groups --reset-env -- env "$@"
  fi
  exec env "$@"
}

# Starts "$@" detached (own session, stdin closed, output to DIR/NAME.log), pid in DIR/NAME.pid.
spawn() {
  local name=$1; shift
  setsid "$@" </dev/null >>"$dir/$name.log" 2>&1 &
  echo $! >"$dir/$name.pid"
}

alive() { [ -f "$dir/$1.pid" ] && kill -0 "$(cat "$dir/$1.pid")" 2>/dev/null; }

# Waits up to $1 seconds for "${@:2}" to succeed.
wait_for() {
  local secs=$1; shift
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

primary_via_lb() {
  [ "$(psql -h 127.0.0.1 -p "$lb" -U postgres -d postgres -XAtqc 'select pg_is_in_recovery()' 2>/dev/null)" = f ]
}

# The cluster (from the first node's REST API) has a leader and a synchronous standby that streams.
synchronous() {
  local c
  c=$(curl -fsS --max-time 2 "http://127.0.0.1:${api[0]}/cluster" 2>/dev/null || curl -fsS --max-time 2 "http://127.0.0.1:${api[1]}/cluster")
  python3 -c '
import json, sys
m = json.loads(sys.argv[1])["members"]
ok = any(x["role"] == "leader" and x["state"] == "running" for x in m) and any(
    x["role"] == "sync_standby" and x["state"] in ("streaming", "running") for x in m)
sys.exit(0 if ok else 1)' "$c"
}

node_env() { # node index (0-based): Patroni's per-node settings
  local i=$1 n=$(($1 + 1))
  echo "PATRONI_NAME=node$n"
  echo "PATRONI_ETCD3_HOSTS=127.0.0.1:$etcd_port"
  echo "PATRONI_RESTAPI_LISTEN=127.0.0.1:${api[$i]}"
  echo "PATRONI_RESTAPI_CONNECT_ADDRESS=127.0.0.1:${api[$i]}"
  echo "PATRONI_POSTGRESQL_LISTEN=127.0.0.1:${pg[$i]}"
  echo "PATRONI_POSTGRESQL_CONNECT_ADDRESS=127.0.0.1:${pg[$i]}"
  echo "PATRONI_POSTGRESQL_DATA_DIR=$dir/node$n/data"
  echo "PATRONI_POSTGRESQL_PGPASS=$dir/node$n/pgpass"
}

start() {
  for t in etcd patroni patronictl haproxy psql curl setpriv; do
    command -v "$t" >/dev/null 2>&1 || fail "$t not found (scripts/ensure-patroni.sh, scripts/ensure-postgres.sh)"
  done
  [ -x /usr/lib/postgresql/15/bin/postgres ] || fail "PostgreSQL 15 not in /usr/lib/postgresql/15/bin"
  for p in etcd node1 node2 haproxy; do
    ! alive "$p" || fail "$p is running already in $dir (stop it first)"
  done
  mkdir -p "$dir/etcd" "$dir/node1" "$dir/node2"
  chmod 700 "$dir/node1" "$dir/node2"
  if [ "$(id -u)" -eq 0 ]; then
    chown -R postgres:postgres "$dir"
    # The nodes' Unix sockets go to PostgreSQL's default directory.
    install -d -o postgres -g postgres -m 2775 /var/run/postgresql
  fi

  spawn etcd bash -c "$(declare -f as_pg); as_pg etcd --name pgc --data-dir '$dir/etcd' \
    --listen-client-urls http://127.0.0.1:$etcd_port --advertise-client-urls http://127.0.0.1:$etcd_port \
    --listen-peer-urls http://127.0.0.1:$etcd_peer --initial-advertise-peer-urls http://127.0.0.1:$etcd_peer \
    --initial-cluster pgc=http://127.0.0.1:$etcd_peer --initial-cluster-state new --initial-cluster-token aqgate-ha"
  wait_for 30 curl -fsS --max-time 1 "http://127.0.0.1:$etcd_port/health" || fail "etcd did not start ($dir/etcd.log)"

  cp "$root/deploy/patroni/patroni.yml" "$dir/patroni.yml"
  for i in 0 1; do
    n=$((i + 1))
    node_env "$i" >"$dir/node$n.env"
    # A whole configuration per node too, for `patronictl -c`.
    { cat "$dir/patroni.yml"; echo "name: node$n"; echo "etcd3: {hosts: '127.0.0.1:$etcd_port'}"
      echo "restapi: {listen: '127.0.0.1:${api[$i]}', connect_address: '127.0.0.1:${api[$i]}'}"; } >"$dir/node$n.yml"
    [ "$(id -u)" -ne 0 ] || chown postgres:postgres "$dir/node$n.env" "$dir/node$n.yml" "$dir/patroni.yml"
    # The first node bootstraps the cluster (initdb) before the second one clones it.
    spawn "node$n" bash -c "$(declare -f as_pg); as_pg HOME='$dir' PATH=/usr/bin:/bin $(tr '\n' ' ' <"$dir/node$n.env") patroni '$dir/patroni.yml'"
    if [ "$i" -eq 0 ]; then
      wait_for 60 curl -fsS --max-time 1 "http://127.0.0.1:${api[0]}/primary" ||
        fail "node1 did not become the leader ($dir/node1.log)"
    fi
  done

  AQGATE_PG_LISTEN=127.0.0.1:$lb AQGATE_PG_NODE1=127.0.0.1:${pg[0]} AQGATE_PG_NODE2=127.0.0.1:${pg[1]} \
    AQGATE_PG_CHECK1=${api[0]} AQGATE_PG_CHECK2=${api[1]} \
    spawn haproxy haproxy -db -f "$root/deploy/patroni/haproxy.cfg"
  wait_for 30 primary_via_lb || fail "HAProxy does not route to a primary ($dir/haproxy.log)"
  wait_for 90 synchronous || fail "no synchronous standby ($dir/node2.log)"
  say "up: leader and synchronous standby; clients: postgres://postgres@127.0.0.1:$lb/postgres"
}

stop_one() { # NAME SECONDS: SIGTERM, then SIGKILL after SECONDS
  local name=$1 secs=$2 pid
  [ -f "$dir/$name.pid" ] || return 0
  pid=$(cat "$dir/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + secs))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/$name.pid"
}

stop() {
  [ -d "$dir" ] || return 0
  stop_one haproxy 5
  # Patroni stops its PostgreSQL on SIGTERM (both at once: neither waits for the other).
  for n in node1 node2; do
    [ -f "$dir/$n.pid" ] && kill -TERM "$(cat "$dir/$n.pid")" 2>/dev/null || true
  done
  stop_one node1 30
  stop_one node2 30
  # A postmaster that outlived its Patroni (it was killed): by its own pid file.
  for n in node1 node2; do
    f="$dir/$n/data/postmaster.pid"
    if [ -f "$f" ]; then
      pid=$(head -1 "$f")
      if [ -n "$pid" ] && [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = postgres ]; then
        kill -QUIT "$pid" 2>/dev/null || true
      fi
    fi
  done
  stop_one etcd 10
  say "stopped ($dir)"
}

status() {
  if alive node1 || alive node2; then
    patronictl -c "$dir/node1.yml" list || true
  else
    echo "no Patroni node running in $dir"
  fi
  if primary_via_lb; then echo "HAProxy 127.0.0.1:$lb routes to a primary"; else echo "HAProxy 127.0.0.1:$lb routes to no primary"; fi
}

case $cmd in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) usage ;;
esac
