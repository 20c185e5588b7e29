"""Real servers for the tests, on free ports in temporary directories: PostgreSQL (wal_level =
logical; as the ``postgres`` OS user when we are root, as ``crates/relay-testkit`` does),
``nats-server -js`` and the ``outbox-relay`` binary. Never the shared servers on standard ports."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[3]
DB = "app"
STREAM = "OUTBOX"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(interval)


def _pg_bin() -> Path:
    explicit = os.environ.get("RELAY_TEST_PG_BIN")
    if explicit:
        return Path(explicit)
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if not found:
        raise RuntimeError(
            "PostgreSQL server binaries not found: no /usr/lib/postgresql/*/bin; run "
            "scripts/ensure-deps.sh or set RELAY_TEST_PG_BIN"
        )
    return Path(found[-1]).parent


class Postgres:
    """``initdb`` + ``pg_ctl start`` in a temporary directory owned by the server's OS user, from
    $RELAY_TEST_PG_BIN, else the newest /usr/lib/postgresql/*/bin."""

    def __init__(self) -> None:
        self.bin = _pg_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="consumer-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.port = 0
        self.as_root = os.geteuid() == 0
        if self.as_root:
            # PostgreSQL refuses to run as root.
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--encoding=UTF8", "--locale=C", "--no-sync")
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.dir),
            "wal_level": "logical",
            "max_wal_senders": "10",
            "max_replication_slots": "10",
            "fsync": "off",
            "shared_buffers": "32MB",
            "dynamic_shared_memory_type": "mmap",
            "TimeZone": "UTC",
            "lc_messages": "C",
        }
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("\n# ---- consumer tests ----\n")
            for k, v in settings.items():
                f.write(f"{k} = '{v}'\n")
        for _ in range(5):
            self.port = free_port()
            if self.start(check=False):
                break
        else:
            raise RuntimeError(f"PostgreSQL did not start:\n{self.log_tail()}")

    def _cmd(self, program: str, *args: str) -> List[str]:
        cmd = [str(self.bin / program), *args]
        return ["runuser", "-u", "postgres", "--", *cmd] if self.as_root else cmd

    def _run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", TZ="UTC")
        out = subprocess.run(self._cmd(program, *args), cwd=self.dir, env=env,
                             capture_output=True, text=True, timeout=90)
        if check and out.returncode != 0:
            raise RuntimeError(f"{program} failed: {out.stdout}{out.stderr}\n{self.log_tail()}")
        return out

    def start(self, check: bool = True) -> bool:
        out = self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w",
                        "-t", "60", "-o", f"-p {self.port}", check=check)
        return out.returncode == 0

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w", "-t", "60",
                  check=False)

    def restart_immediate(self) -> None:
        """A crash-like stop (no checkpoint, connections cut), then a start with recovery."""
        self.stop("immediate")
        deadline = time.monotonic() + 60
        while not self.start(check=False):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start again:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text().splitlines()[-30:])
        except OSError:
            return ""

    def url(self, db: str = DB) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


def _nats_server() -> str:
    explicit = os.environ.get("RELAY_TEST_NATS_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RuntimeError(f"RELAY_TEST_NATS_SERVER={explicit} is not an executable")
        return explicit
    found = shutil.which("nats-server", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin")
    if not found:
        raise RuntimeError(
            "nats-server not found on PATH: run scripts/ensure-deps.sh or set "
            "RELAY_TEST_NATS_SERVER"
        )
    return found


class Nats:
    """``nats-server -js`` ($RELAY_TEST_NATS_SERVER, else the one on PATH)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="consumer-nats-"))
        self.port = free_port()
        self.log = self.dir / "nats.log"
        self.proc = subprocess.Popen(
            [_nats_server(), "-js", "-a", "127.0.0.1",
             "-p", str(self.port), "-sd", str(self.dir / "js")],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"),
        )
        wait_until(lambda: "Server is ready" in self.log.read_text(), 20, "nats-server ready")

    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def relay_bin() -> str:
    path = os.environ.get("OUTBOX_RELAY_BIN") or str(REPO / "target/debug/outbox-relay")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path}: no relay binary; run `cargo build -p outbox-relay` first")
    return path


class Relay:
    """The real relay, configured as tests/e2e/support.rs does (default outbox mapping)."""

    def __init__(self, env: "Env", duplicate_window: str = "2m") -> None:
        self.config = env.dir / "relay.toml"
        self.config.write_text(
            f"""
[postgres]
url = "{env.pg.url()}"
slot = "relay_slot"
publication = "relay_pub"
status_interval = "1s"

[nats]
url = "{env.nats.url()}"
stream = "{STREAM}"
ack_timeout = "3s"
create_stream = true
duplicate_window = "{duplicate_window}"

[relay]
checkpoint_interval = "100ms"
idle_checkpoint_interval = "1s"
reconnect_max = "1s"
"""
        )
        self.log = env.dir / "relay.log"
        self.proc: Optional[subprocess.Popen] = None
        self.start()

    def start(self) -> None:
        offset = self.log.stat().st_size if self.log.exists() else 0
        self.proc = subprocess.Popen(
            [relay_bin(), "--config", str(self.config), "run"],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "a"),
            env={**os.environ, "RUST_LOG": "info"},
        )
        wait_until(lambda: "replication started" in self.log.read_text()[offset:] or
                   self.proc.poll() is not None, 30, "relay replication started")
        assert self.proc.poll() is None, self.log.read_text()

    def command(self, *args: str) -> str:
        out = subprocess.run([relay_bin(), "--config", str(self.config), *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"outbox-relay {args}: {out.stdout}{out.stderr}"
        return out.stdout

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


class Env:
    """PostgreSQL with the relay's migrations in database ``app``, NATS, and the relay."""

    def __init__(self, duplicate_window: str = "2m") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="consumer-env-"))
        self.pg = Postgres()
        self.nats = Nats()
        import psycopg

        with psycopg.connect(self.pg.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        with psycopg.connect(self.pg.url(), autocommit=True) as conn:
            for path in sorted((REPO / "migrations").glob("*.sql")):
                conn.execute(path.read_text())
            conn.execute(
                # No unique key on purpose: an event applied twice shows as two rows.
                "CREATE TABLE effects (n bigserial PRIMARY KEY, service text NOT NULL,"
                " event_id text NOT NULL, delivered int NOT NULL, body text)"
            )
        self.relay = Relay(self, duplicate_window)

    def close(self) -> None:
        for part in (self.relay, self.nats, self.pg):
            try:
                part.close()
            except Exception:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
