#!/usr/bin/env bash
# The fault suite with heavier load and longer settling (minutes, not for CI):
# every scenario of tests/e2e/faults, then the table; opt-in extras below (BACKFILL_SOAK,
# CLEANUP_SOAK, FAULT_MODES, FAULT_PATHS).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/ensure-deps.sh
export FAULT_REPORT="$PWD/target/fault-soak.tsv"
rm -f "$FAULT_REPORT"
FAULT_SOAK=1 cargo test --locked -p outbox-relay --all-features --test e2e faults -- --test-threads 1 --include-ignored || status=$?
scripts/fault-table.sh "$FAULT_REPORT"
# Opt-in (BACKFILL_SOAK=1): backfill a 1,000,000-row outbox table (BACKFILL_ROWS) beside the live relay.
if [ "${BACKFILL_SOAK:-0}" = 1 ]; then
  cargo test --locked -p outbox-relay --all-features --test e2e backfill::soak -- --ignored --nocapture || status=$?
  # The same number of rows published by the backfill at slot creation, then streamed.
  cargo test --locked -p outbox-relay --all-features --test e2e backfill_on_create::soak -- --ignored --nocapture || status=$?
fi
# Opt-in (CLEANUP_SOAK=1): relay-bench's cleanup rows for 10 minutes per [outbox.cleanup] mode
# beside a 10,000 events/s load (the table size must stay flat); CLEANUP_SOAK_ARGS adds options,
# e.g. "--cleanup-secs 300 --cleanup-modes off,delete".
if [ "${CLEANUP_SOAK:-0}" = 1 ]; then
  # shellcheck disable=SC2086 # CLEANUP_SOAK_ARGS is a list of options
  scripts/bench.sh --soak-cleanup --no-debezium ${CLEANUP_SOAK_ARGS:-} || status=$?
fi
# Opt-in (FAULT_MODES="per-message atomic-batch fast-batch", FAULT_PATHS="lean async-nats"): the
# fault suite again in each publish mode on each publish path (the fault scenarios must pass in
# every one), on the newer servers (atomic batches need nats-server >= 2.12.1); each row is named
# "[mode, path]" and the relay must log that it took the mode and the path.
if [ -n "${FAULT_MODES:-}${FAULT_PATHS:-}" ]; then
  (
    eval "$(scripts/ensure-deps.sh --new-servers)"
    for path in ${FAULT_PATHS:-lean}; do
      for mode in ${FAULT_MODES:-per-message}; do
        export FAULT_REPORT="$PWD/target/fault-soak-$mode-$path.tsv"
        rm -f "$FAULT_REPORT"
        FAULT_PUBLISH_MODE="$mode" FAULT_PUBLISH_PATH="$path" cargo test --locked -p outbox-relay \
          --all-features --test e2e faults -- --test-threads 1 --include-ignored || exit 1
        scripts/fault-table.sh "$FAULT_REPORT"
      done
    done
  ) || status=$?
fi
exit "${status:-0}"
