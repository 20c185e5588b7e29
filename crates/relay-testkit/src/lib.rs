//! Starts real, throw-away PostgreSQL and nats-server processes for the
//! outbox-relay tests.
//!
//! Every server gets its own free port on 127.0.0.1 and its own temporary
//! directory, so tests may run in parallel threads and processes. Servers
//! never use the machine's shared instances (5432, 4222).
//!
//! * [`PostgresServer`]: `initdb` + `pg_ctl start` with `wal_level=logical`
//!   (one `initdb` per PostgreSQL build, kept in the temporary directory as a
//!   template that each cluster copies). When the tests run as root, PostgreSQL runs as the `postgres` OS user.
//! * [`NatsServer`]: `nats-server` with JetStream and a file store.
//! * [`NatsCluster`]: several nats-servers with cluster routes and
//!   JetStream (streams with 3 replicas), plus [`stream_leader_stepdown`]
//!   and [`stream_leader`].
//! * [`NatsLeafPair`]: a hub nats-server and a leaf node connected to it, with JetStream in
//!   domains [`HUB_DOMAIN`] and [`LEAF_DOMAIN`].
//! * [`NatsOperator`]: operator-mode nats-server configuration (JWTs signed with NKeys) and
//!   users as `.creds` files.
//! * [`TestCa`]: a throw-away CA for TLS-enabled servers ([`PgSecurity::tls`],
//!   [`NatsOptions::tls`]).
//! * [`FaultProxy`]: a TCP proxy in front of a server that can delay,
//!   blackhole, cut or refuse connections.
//!
//! Which binaries are used:
//! * PostgreSQL: [`PgOptions::bin_dir`], else `$RELAY_TEST_PG_BIN` (a
//!   directory holding `initdb`, `pg_ctl` and `postgres`), else the newest
//!   `/usr/lib/postgresql/*/bin`.
//! * NATS: [`NatsOptions::binary`], else `$RELAY_TEST_NATS_SERVER`, else
//!   `nats-server` on `PATH` (or in `/usr/sbin`, `/usr/bin`).
//!
//! A missing binary is reported with a hint to run `scripts/ensure-deps.sh`.
//!
//! Cleanup: `Drop` kills the server and removes its directory. Should the
//! test process die without running `Drop` (SIGKILL, abort), a small watchdog
//! `sh` process notices the end of its stdin pipe and does the same.

mod nats;
mod nats_cluster;
mod nats_jwt;
mod nats_leaf;
mod otlp;
mod postgres;
mod procs;
mod proxy;
mod tls;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, PoisonError};

pub use nats::{NatsOptions, NatsServer, new_nkey_user};
pub use nats_cluster::{
    CLUSTER_READY_TIMEOUT, NatsCluster, nats_request, stream_leader, stream_leader_stepdown,
};
pub use nats_jwt::{NatsOperator, UserPermissions};
pub use nats_leaf::{HUB_DOMAIN, LEAF_DOMAIN, NatsLeafPair};
pub use otlp::{OtlpReceiver, ReceivedSpan};
pub use postgres::{PgOptions, PgSecurity, PostgresServer, StandbyOptions, multi_host_url};
pub use proxy::FaultProxy;
pub use tls::{IssuedCert, TestCa};

/// The address every test server listens on.
pub const HOST: &str = "127.0.0.1";

/// SIGSTOPs process `pid` (a relay a test started, say) and returns once every thread of it is
/// stopped, as the servers' `pause` does: `kill` alone returns before the process stopped.
pub fn pause_process(pid: u32) -> anyhow::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| anyhow::anyhow!("pid {pid} out of range"))?;
    match procs::Proc::get(pid) {
        Some(process) => process.pause(),
        None => anyhow::bail!("pause: process {pid} is not running"),
    }
}

/// A free TCP port on 127.0.0.1.
///
/// The port is found by binding `127.0.0.1:0`; a port is never handed out
/// twice by one process, which avoids clashes between tests in the same
/// binary. Another process may still take it before the server binds it, so
/// the servers retry on a new port when that happens.
///
/// # Panics
/// If no port can be bound at all (no loopback interface).
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    for _ in 0..1000 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .expect("relay-testkit: cannot bind a TCP port on 127.0.0.1");
        let port = listener
            .local_addr()
            .expect("relay-testkit: bound socket has no local address")
            .port();
        if HANDED_OUT
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(port)
        {
            return port;
        }
    }
    panic!("relay-testkit: no unused free port found after 1000 tries");
}

pub(crate) const ENSURE_DEPS_HINT: &str =
    "install it with `scripts/ensure-deps.sh` (as root, or with sudo)";
