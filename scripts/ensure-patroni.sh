#!/usr/bin/env bash
# Installs what tests/failover.rs runs a PostgreSQL failover with (Debian packages): Patroni
# (patroni, patronictl), etcd (its distributed configuration store: etcd-server, and
# etcd-client for etcdctl) and HAProxy (routes to the primary). Nothing is started here:
# scripts/pg-cluster.sh starts a private cluster (own ports, own data directory) per run.
# PostgreSQL itself comes from ensure-postgres.sh.
set -euo pipefail
need=()
command -v patroni >/dev/null 2>&1 || need+=(patroni)
command -v patronictl >/dev/null 2>&1 || need+=(patroni)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
if [ ${#need[@]} -gt 0 ]; then
  echo "ensure-patroni: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
echo "ensure-patroni: ok"
