#!/usr/bin/env bash
# The containers of compose.yaml's `ha` profile (run as the postgres user): what
# scripts/pg-cluster.sh runs on one machine for tests/failover.rs, one role per container,
# its state in /var/lib/aqgate-ha (a volume).
#
#   entrypoint.sh etcd      etcd, Patroni's configuration store; ETCD_NAME names the member
#                           (and the host the others reach it at)
#   entrypoint.sh patroni   a Patroni-managed PostgreSQL 15 node: deploy/patroni/patroni.yml
#                           (ttl, loop_wait, retry_timeout, synchronous_mode, pg_rewind,
#                           primary_start_timeout as tested), the node's settings from
#                           PATRONI_* variables. One change: pg_hba lets the compose network
#                           in with a password (scram-sha-256) instead of trusting 127.0.0.1.
#   entrypoint.sh haproxy   deploy/patroni/haproxy.cfg (AQGATE_PG_* variables)
set -euo pipefail

state=/var/lib/aqgate-ha
conf=/etc/aqgate/patroni

case "${1:-}" in
  etcd)
    name="${ETCD_NAME:?ETCD_NAME must name the etcd member}"
    exec etcd --name "$name" --data-dir "$state/etcd" \
      --listen-client-urls http://0.0.0.0:2379 --advertise-client-urls "http://$name:2379" \
      --listen-peer-urls http://0.0.0.0:2380 --initial-advertise-peer-urls "http://$name:2380" \
      --initial-cluster "$name=http://$name:2380" --initial-cluster-state new --initial-cluster-token aqgate-ha
    ;;
  patroni)
    : "${PATRONI_NAME:?PATRONI_NAME must name the node}"
    : "${PATRONI_SUPERUSER_PASSWORD:?PATRONI_SUPERUSER_PASSWORD must be set (a network needs passwords)}"
    # One role (postgres) is superuser, replication and rewind user: one password.
    export PATRONI_REPLICATION_PASSWORD="${PATRONI_REPLICATION_PASSWORD:-$PATRONI_SUPERUSER_PASSWORD}"
    export PATRONI_REWIND_PASSWORD="${PATRONI_REWIND_PASSWORD:-$PATRONI_SUPERUSER_PASSWORD}"
    export PATRONI_POSTGRESQL_DATA_DIR="${PATRONI_POSTGRESQL_DATA_DIR:-$state/data}"
    export PATRONI_POSTGRESQL_PGPASS="${PATRONI_POSTGRESQL_PGPASS:-$state/pgpass}"
    # deploy/patroni/patroni.yml with the compose network's pg_hba (Patroni's Python and
    # PyYAML are in the image).
    python3 - "$conf/patroni.yml" "$state/patroni.yml" <<'PY'
import sys
import yaml

with open(sys.argv[1]) as fh:
    c = yaml.safe_load(fh)
c["postgresql"]["pg_hba"] = [
    "local all all peer",
    "host replication all 0.0.0.0/0 scram-sha-256",
    "host all all 0.0.0.0/0 scram-sha-256",
    "host replication all ::/0 scram-sha-256",
    "host all all ::/0 scram-sha-256",
]
with open(sys.argv[2], "w") as fh:
    yaml.safe_dump(c, fh, sort_keys=False)
PY
    exec patroni "$state/patroni.yml"
    ;;
  haproxy)
    exec haproxy -db -f "$conf/haproxy.cfg"
    ;;
  *)
    echo "usage: entrypoint.sh etcd|patroni|haproxy" >&2
    exit 2
    ;;
esac
