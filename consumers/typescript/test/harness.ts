// Real servers for the tests on free ports in temporary directories, as consumers/python/tests/
// harness.py and crates/relay-testkit do: PostgreSQL (wal_level = logical, as the `postgres` OS
// user when we are root), `nats-server -js` and the outbox-relay binary.
import { execFile, execFileSync, spawn, type ChildProcess } from "node:child_process";
import { appendFileSync, chownSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import pg from "pg";

const execFileAsync = promisify(execFile);

export const REPO = resolve(import.meta.dirname, "../../../..");
export const STREAM = "OUTBOX";

export async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => ok(port));
    });
    s.on("error", fail);
  });
}

export async function waitFor<T>(probe: () => Promise<T | null | undefined | false> | T | null | undefined | false, what: string, ms = 30000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (v) return v as T;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function pgBin(): string {
  if (process.env.RELAY_TEST_PG_BIN) return process.env.RELAY_TEST_PG_BIN;
  const versions = existsSync("/usr/lib/postgresql") ? readdirSync("/usr/lib/postgresql").map(Number).filter((n) => n > 0).sort((a, b) => a - b) : [];
  if (!versions.length) throw new Error("PostgreSQL server binaries not found: run scripts/ensure-deps.sh or set RELAY_TEST_PG_BIN");
  return `/usr/lib/postgresql/${versions[versions.length - 1]}/bin`;
}

/** initdb + pg_ctl start from $RELAY_TEST_PG_BIN, else the newest /usr/lib/postgresql/<n>/bin. */
class Postgres {
  readonly dir = mkdtempSync(join(tmpdir(), "consumer-pg-"));
  readonly data = join(this.dir, "data");
  port = 0;
  private readonly root = process.getuid?.() === 0;
  private readonly bin = pgBin();

  private command(program: string, args: string[]): [string, string[], { cwd: string; env: NodeJS.ProcessEnv; timeout: number }] {
    const cmd = [join(this.bin, program), ...args];
    const [file, argv] = this.root ? ["runuser", ["-u", "postgres", "--", ...cmd]] : [cmd[0], cmd.slice(1)];
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("PG")));
    return [file, argv, { cwd: this.dir, env: { ...env, LC_ALL: "C", TZ: "UTC" }, timeout: 90000 }];
  }

  private run(program: string, args: string[], check = true): boolean {
    const [file, argv, options] = this.command(program, args);
    try {
      execFileSync(file, argv, { ...options, stdio: "pipe" });
      return true;
    } catch (e) {
      if (check) throw new Error(`${program} failed: ${(e as { stderr?: Buffer }).stderr?.toString()}`);
      return false;
    }
  }

  /** `run` without blocking the event loop (for a consumer running in this process meanwhile). */
  private async runAsync(program: string, args: string[]): Promise<boolean> {
    const [file, argv, options] = this.command(program, args);
    return execFileAsync(file, argv, options).then(
      () => true,
      () => false,
    );
  }

  async start(): Promise<void> {
    if (this.root) {
      // PostgreSQL refuses to run as root.
      const uid = Number(execFileSync("id", ["-u", "postgres"]).toString());
      const gid = Number(execFileSync("id", ["-g", "postgres"]).toString());
      chownSync(this.dir, uid, gid);
    }
    this.run("initdb", ["-D", this.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"]);
    const settings: Record<string, string> = {
      listen_addresses: "127.0.0.1", unix_socket_directories: this.dir, wal_level: "logical", max_wal_senders: "10",
      max_replication_slots: "10", fsync: "off", shared_buffers: "32MB", dynamic_shared_memory_type: "mmap", TimeZone: "UTC",
    };
    appendFileSync(join(this.data, "postgresql.conf"), Object.entries(settings).map(([k, v]) => `${k} = '${v}'\n`).join(""));
    for (let i = 0; i < 5; i++) {
      this.port = await freePort();
      if (await this.pgCtlStart()) return;
    }
    throw new Error(`PostgreSQL did not start: ${readFileSync(join(this.dir, "postgres.log"), "utf8")}`);
  }

  private pgCtlStart(): Promise<boolean> {
    return this.runAsync("pg_ctl", ["start", "-D", this.data, "-l", join(this.dir, "postgres.log"), "-w", "-t", "60", "-o", `-p ${this.port}`]);
  }

  /** A crash-like stop (no checkpoint, connections cut), then a start with recovery on the same
   * port. */
  async restartImmediate(): Promise<void> {
    await this.runAsync("pg_ctl", ["stop", "-D", this.data, "-m", "immediate", "-w", "-t", "60"]);
    await waitFor(() => this.pgCtlStart(), "PostgreSQL started again", 60000);
  }

  url(db = "app"): string {
    return `postgresql://postgres@127.0.0.1:${this.port}/${db}`;
  }

  close(): void {
    this.run("pg_ctl", ["stop", "-D", this.data, "-m", "immediate", "-w"], false);
    rmSync(this.dir, { recursive: true, force: true });
  }
}

function natsServer(): string {
  const explicit = process.env.RELAY_TEST_NATS_SERVER;
  if (explicit) {
    if (!existsSync(explicit)) throw new Error(`RELAY_TEST_NATS_SERVER=${explicit} does not exist`);
    return explicit;
  }
  return "nats-server";
}

/** `nats-server -js` ($RELAY_TEST_NATS_SERVER, else the one on PATH). */
class Nats {
  readonly dir = mkdtempSync(join(tmpdir(), "consumer-nats-"));
  port = 0;
  proc: ChildProcess | null = null;

  async start(): Promise<void> {
    this.port = await freePort();
    const log = join(this.dir, "nats.log");
    this.proc = spawn(natsServer(), ["-js", "-a", "127.0.0.1", "-p", String(this.port), "-sd", join(this.dir, "js")], { stdio: ["ignore", "ignore", openSync(log, "w")] });
    await waitFor(() => readFileSync(log, "utf8").includes("Server is ready"), "nats-server ready", 20000);
  }

  url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  close(): void {
    this.proc?.kill("SIGKILL");
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export function relayBin(): string {
  const path = process.env.OUTBOX_RELAY_BIN ?? join(REPO, "target/debug/outbox-relay");
  if (!existsSync(path)) throw new Error(`${path}: no relay binary; run \`cargo build -p outbox-relay\` first`);
  return path;
}

/** PostgreSQL with the relay's migrations in `app`, NATS, and the relay (default mapping). */
export class Env {
  readonly dir = mkdtempSync(join(tmpdir(), "consumer-env-"));
  readonly pg = new Postgres();
  readonly nats = new Nats();
  relay: ChildProcess | null = null;
  readonly config = join(this.dir, "relay.toml");

  static async start(duplicateWindow = "2m"): Promise<Env> {
    const env = new Env();
    try {
      await env.setUp(duplicateWindow);
    } catch (e) {
      // Servers left running would keep the test process from exiting.
      env.close();
      throw e;
    }
    return env;
  }

  private async setUp(duplicateWindow: string): Promise<void> {
    await Promise.all([this.pg.start(), this.nats.start()]);
    const admin = new pg.Client(this.pg.url("postgres"));
    await admin.connect();
    await admin.query("CREATE DATABASE app");
    await admin.end();
    const db = new pg.Client(this.pg.url());
    await db.connect();
    for (const f of readdirSync(join(REPO, "migrations")).filter((f) => f.endsWith(".sql")).sort()) {
      await db.query(readFileSync(join(REPO, "migrations", f), "utf8"));
    }
    // No unique key on purpose: an event applied twice shows as two rows.
    await db.query("CREATE TABLE effects (n bigserial PRIMARY KEY, service text NOT NULL, event_id text NOT NULL, delivered int NOT NULL, body text)");
    await db.end();
    writeFileSync(this.config, `
[postgres]
url = "${this.pg.url()}"
slot = "relay_slot"
publication = "relay_pub"
status_interval = "1s"

[nats]
url = "${this.nats.url()}"
stream = "${STREAM}"
ack_timeout = "3s"
create_stream = true
duplicate_window = "${duplicateWindow}"

[relay]
checkpoint_interval = "100ms"
idle_checkpoint_interval = "1s"
reconnect_max = "1s"
`);
    const log = join(this.dir, "relay.log");
    this.relay = spawn(relayBin(), ["--config", this.config, "run"], { stdio: ["ignore", "ignore", openSync(log, "w")], env: { ...process.env, RUST_LOG: "info" } });
    await waitFor(() => readFileSync(log, "utf8").includes("replication started"), "relay replication started");
  }

  relayCommand(...args: string[]): string {
    return execFileSync(relayBin(), ["--config", this.config, ...args], { timeout: 60000 }).toString();
  }

  close(): void {
    this.relay?.kill("SIGKILL");
    this.nats.close();
    this.pg.close();
    rmSync(this.dir, { recursive: true, force: true });
  }
}
