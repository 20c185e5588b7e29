#!/usr/bin/env bash
# Runs outbox-relay end to end on this machine:
#   - installs what is missing (scripts/ensure-deps.sh) and builds the relay;
#   - starts a local PostgreSQL (wal_level=logical) and nats-server -js, unless
#     RELAY_POSTGRES__URL / RELAY_NATS__URL point at servers of yours;
#   - applies migrations/*.sql, starts the relay, inserts a few outbox rows and prints them as
#     they arrive from JetStream; then stops the relay cleanly (SIGTERM) and the local servers.
# Pass --keep to leave the relay and the servers running (Ctrl-C stops everything).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"
keep=0
[ "${1:-}" = "--keep" ] && keep=1

say() { printf '\n==> %s\n' "$*" >&2; }

say "dependencies and build"
scripts/ensure-deps.sh
cargo build --locked -p outbox-relay
relay="$repo/target/debug/outbox-relay"

work="$(mktemp -d /tmp/outbox-relay-quickstart.XXXXXX)"
chmod 755 "$work"
pids=()
pg_bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
as_pg=()
[ "$(id -u)" -eq 0 ] && as_pg=(runuser -u postgres --)
pg_data="$work/pg"

cleanup() {
    set +e
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
    if [ -d "$pg_data" ]; then "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_data" -m fast stop >/dev/null 2>&1; fi
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ -z "${RELAY_POSTGRES__URL:-}" ]; then
    pg_port="$(free_port)"
    say "starting PostgreSQL ($pg_bin) on 127.0.0.1:$pg_port with wal_level=logical"
    mkdir -p "$pg_data"
    [ "$(id -u)" -eq 0 ] && chown postgres "$work" "$pg_data"
    "${as_pg[@]}" "$pg_bin/initdb" -D "$pg_data" -U postgres -A trust >/dev/null
    "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_data" -l "$pg_data/log" -w start \
        -o "-p $pg_port -k $work -c listen_addresses=127.0.0.1 -c wal_level=logical -c max_slot_wal_keep_size=1GB" >/dev/null
    "${as_pg[@]}" "$pg_bin/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -qc "CREATE DATABASE app"
    export RELAY_POSTGRES__URL="postgres://postgres@127.0.0.1:$pg_port/app"
fi
if [ -z "${RELAY_NATS__URL:-}" ]; then
    nats_port="$(free_port)"
    say "starting nats-server -js on 127.0.0.1:$nats_port"
    nats-server -a 127.0.0.1 -p "$nats_port" -js -sd "$work/nats" >"$work/nats.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 50); do grep -q "Server is ready" "$work/nats.log" && break; sleep 0.1; done
    export RELAY_NATS__URL="nats://127.0.0.1:$nats_port"
fi
psql_app() { psql "$RELAY_POSTGRES__URL" -v ON_ERROR_STOP=1 -q "$@"; }

say "applying migrations"
for f in migrations/*.sql; do echo "  $f" >&2; psql_app -f "$f"; done

export RELAY_NATS__CREATE_STREAM=true
say "starting the relay (log: $work/relay.log)"
"$relay" run >"$work/relay.log" 2>&1 &
relay_pid=$!
pids+=("$relay_pid")
for _ in $(seq 100); do grep -q "replication started" "$work/relay.log" && break; sleep 0.1; done
grep -q "replication started" "$work/relay.log" || { cat "$work/relay.log" >&2; exit 1; }

say "inserting three outbox rows"
psql_app <<'SQL'
BEGIN;
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), 'Order', '1001', 'OrderCreated', '{"orderId": 1001, "total": 42.5}'),
       (gen_random_uuid(), 'Order', '1001', 'OrderPaid', '{"orderId": 1001}');
COMMIT;
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), 'Customer', '7', 'CustomerRegistered', '{"customerId": 7}');
SQL

say "messages in JetStream stream OUTBOX"
"$relay" tail --count 3 --idle-timeout 15s

if [ "$keep" -eq 1 ]; then
    say "running: PostgreSQL $RELAY_POSTGRES__URL, NATS $RELAY_NATS__URL; Ctrl-C stops everything"
    wait "$relay_pid"
else
    say "stopping the relay with SIGTERM (drains acks, stores the checkpoint, exits 0)"
    kill -TERM "$relay_pid"
    wait "$relay_pid" && echo "relay exited 0" >&2
    grep -E "resuming|drained|stopped cleanly" "$work/relay.log" | sed 's/^/  /' >&2
fi
