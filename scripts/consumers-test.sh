#!/usr/bin/env bash
# Tests of the Python and TypeScript consumer libraries (consumers/python, consumers/typescript)
# against real servers each test starts itself on free ports: PostgreSQL (RELAY_TEST_PG_BIN, a bin
# directory, else the newest /usr/lib/postgresql/*/bin; as the `postgres` OS user when run as
# root), `nats-server -js` (RELAY_TEST_NATS_SERVER, else the one on PATH), and the relay binary
# target/debug/outbox-relay (built here; OUTBOX_RELAY_BIN overrides). After
# `eval "$(scripts/ensure-deps.sh --new-servers)"` they run on PostgreSQL 18 and the current
# nats-server.
#
# Installs what the suites need: a venv under .local/py-venv (nats-py, psycopg, pytest, pinned in
# consumers/python/pyproject.toml) and `npm ci` in consumers/typescript (package-lock.json).
# Fails first when a package's copy of crates/outbox-contract/contract.json or of the ledger
# migration differs from the crate's (`--sync` copies them instead).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

started=$SECONDS
step() { printf '\n==> [%dm%02ds] %s\n' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)) "$*" >&2; }

contract=crates/outbox-contract/contract.json
migration=crates/outbox-consumer/migrations/0001_consumer_ledger.sql
copies=(
    "$contract consumers/python/outbox_consumer/contract.json"
    "$migration consumers/python/outbox_consumer/ledger.sql"
    "$contract consumers/typescript/src/contract.json"
    "$migration consumers/typescript/src/ledger.sql"
)
if [[ ${1:-} == --sync ]]; then
    for pair in "${copies[@]}"; do cp $pair; done
    echo "copied $contract and $migration into the consumer packages"
    exit 0
fi

step "contract copies"
for pair in "${copies[@]}"; do
    read -r from to <<<"$pair"
    if ! cmp -s "$from" "$to"; then
        echo "$to differs from $from: run scripts/consumers-test.sh --sync and commit" >&2
        exit 1
    fi
done

# The servers the harnesses pick (tests/harness.py, test/harness.ts), named in the log.
pg_bin=${RELAY_TEST_PG_BIN:-$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin \
    2>/dev/null | sort -V | tail -n 1 || true)}
nats_server=${RELAY_TEST_NATS_SERVER:-$(command -v nats-server || echo nats-server)}
step "servers: $("$pg_bin/postgres" --version 2>&1) ($pg_bin);" \
    "$("$nats_server" --version 2>&1) ($nats_server)"

step "relay binary"
if [[ -z ${OUTBOX_RELAY_BIN:-} ]]; then
    # The same invocation as scripts/test.sh's test step (one feature set): after that step it
    # builds nothing; `cargo build -p outbox-relay` alone would rebuild dependencies with other
    # features (minutes).
    cargo test --workspace --locked --all-features --no-run
fi

step "python: venv and packages"
venv=.local/py-venv
if [[ ! -x $venv/bin/python ]]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -e 'consumers/python[test]'

step "python: pytest"
(cd consumers/python && "../../$venv/bin/python" -m pytest -q -p no:cacheprovider tests)

step "typescript: npm ci"
(cd consumers/typescript && npm ci --no-audit --no-fund --loglevel=error)

step "typescript: node --test"
(cd consumers/typescript && npm test --silent)

step "done"
