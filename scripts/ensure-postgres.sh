#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers at 127.0.0.1:5432 with trust auth for user
# postgres: installs Debian's postgresql and starts its cluster when none is running.
set -euo pipefail

if ! command -v pg_isready >/dev/null 2>&1 || ! command -v psql >/dev/null 2>&1; then
  echo "ensure-postgres: installing postgresql" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql postgresql-client >/dev/null
fi

if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  ver=$(ls /etc/postgresql | sort -n | tail -1)
  if [ -z "$ver" ]; then
    echo "ensure-postgres: no cluster configuration found" >&2
    exit 1
  fi
  conf=/etc/postgresql/$ver/main
  # Trust local TCP connections (a throwaway test server) and listen on loopback.
  if ! grep -q '^host all all 127.0.0.1/32 trust' "$conf/pg_hba.conf"; then
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$conf/pg_hba.conf"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start
  for _ in $(seq 1 60); do
    pg_isready -h 127.0.0.1 -p 5432 -q && break
    sleep 0.5
  done
fi
pg_isready -h 127.0.0.1 -p 5432
psql "${AQGATE_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}" -Atqc 'select 1' >/dev/null
echo "ensure-postgres: PostgreSQL is up"
