#!/usr/bin/env bash
# Runs the whole aqgate test suite on a fresh Debian machine: installs and starts what the
# tests need (PostgreSQL, RabbitMQ, NATS, Mosquitto; Patroni, etcd and HAProxy for the failover test), then runs fmt, clippy and every test (the browser tests in headless Chromium among them) on both store backends, then
# the README's quick start on a fresh machine (scripts/fresh-machine.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "test.sh: cargo not found: install the Rust toolchain 1.95 or newer (rustup) first" >&2
  exit 1
fi

# A clean clone gains nothing from incremental compilation, whose files would double the
# size of target/ (a whole run needs about 6 GB of disk: the test build, the release build
# of the fresh-machine check and its chroot).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "${free_kb:-0}" -lt $((8 * 1024 * 1024)) ]; then
  echo "test.sh: warning: only $((free_kb / 1024)) MB free on $(df -P . | awk 'NR == 2 { print $6 }'); the run needs about 6 GB" >&2
fi

export AQGATE_TEST_PG_URL="${AQGATE_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
scripts/ensure-postgres.sh
scripts/ensure-brokers.sh
scripts/ensure-tools.sh
scripts/ensure-chromium.sh   # tests/browser.rs: Debian's chromium and chromium-driver
scripts/ensure-patroni.sh    # tests/failover.rs: Patroni, etcd and HAProxy (scripts/pg-cluster.sh)

# Each test makes its own database / SQLite file; drop what earlier runs left behind.
psql "$AQGATE_TEST_PG_URL" -Atqc "SELECT datname FROM pg_database WHERE datname LIKE 'aqgate\_t\_%'" |
  while read -r db; do psql "$AQGATE_TEST_PG_URL" -qc "DROP DATABASE IF EXISTS \"$db\"" >/dev/null; done
rm -f "${TMPDIR:-/tmp}"/aqgate-test-*.db*

# Everything is built with SAML login (the `saml` feature, on the system OpenSSL); the
# default build (vendored OpenSSL, no SAML) is built and run by fresh-machine.sh below.
features=(--no-default-features --features saml)
# Every crate of the lock file, also the default build's (tests/tidy.rs reads its tree offline).
cargo fetch --locked
cargo fmt --all -- --check
scripts/validate-compose.sh
cargo clippy --workspace --all-targets --locked "${features[@]}" -- -D warnings
cargo test --workspace --locked --all-targets "${features[@]}" -- --test-threads="${AQGATE_TEST_THREADS:-4}" --skip kill9_checker_ \
  --skip patroni_failover_
# The kill -9 checker (tests/crash.rs) on its own, one variant at a time, with its figures.
cargo test --locked --test crash "${features[@]}" -- --nocapture --test-threads=1 kill9_checker_
# The PostgreSQL failover (tests/failover.rs, a Patroni cluster on fixed ports; signed mail, and a gateway job to
# the RabbitMQ of ensure-brokers.sh) on its own, with its figures.
cargo test --locked --test failover "${features[@]}" -- --nocapture patroni_failover_
# The quick start on a machine with only a Rust and a C toolchain (a debootstrap chroot).
scripts/fresh-machine.sh
