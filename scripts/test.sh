#!/usr/bin/env bash
# Runs the whole aqgate test suite on a fresh Debian machine: installs and starts what the
# tests need (PostgreSQL), then runs fmt, clippy and every test on both store backends.
set -euo pipefail
cd "$(dirname "$0")/.."

export AQGATE_TEST_PG_URL="${AQGATE_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
scripts/ensure-postgres.sh

cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --locked --all-targets -- --test-threads="${AQGATE_TEST_THREADS:-4}"
