#!/usr/bin/env bash
# The postgres container of compose.yaml (runs as the postgres user). On the first start, an
# empty PGDATA gets a cluster: the superuser postgres may connect only over the local socket
# (peer), and POSTGRES_USER (not a superuser) owns POSTGRES_DB and connects over TCP with
# POSTGRES_PASSWORD (scram-sha-256, from any address: the compose network). Then PostgreSQL
# runs in the foreground, listening on every address. Extra arguments go to postgres
# (e.g. -c log_statement=all).
#
#   POSTGRES_USER, POSTGRES_PASSWORD   required on the first start (TEST ONLY values in compose.yaml)
#   POSTGRES_DB                        default: POSTGRES_USER
#   PGDATA                             default /var/lib/postgresql/data
set -euo pipefail

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_USER:?POSTGRES_USER must be set to initialise the database}"
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set to initialise the database}"
    db="${POSTGRES_DB:-$POSTGRES_USER}"
    echo "entrypoint: initialising $PGDATA (database $db owned by $POSTGRES_USER)" >&2
    initdb --username=postgres --auth-local=peer --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    # initdb allows TCP from loopback only; allow it from anywhere, always with a password.
    printf '%s\n' '# compose network: every address, with a password' \
        'host all all 0.0.0.0/0 scram-sha-256' 'host all all ::/0 scram-sha-256' >> "$PGDATA/pg_hba.conf"
    # A temporary server on the socket only: nobody can connect over TCP before the role exists.
    pg_ctl --silent -w -o "-c listen_addresses=''" start
    psql -X -q -v ON_ERROR_STOP=1 --username=postgres --dbname=postgres \
        --set=user="$POSTGRES_USER" --set=pw="$POSTGRES_PASSWORD" --set=db="$db" <<'SQL'
CREATE ROLE :"user" LOGIN PASSWORD :'pw';
CREATE DATABASE :"db" OWNER :"user";
SQL
    pg_ctl --silent -w -m fast stop
fi

exec postgres -c listen_addresses='*' "$@"
